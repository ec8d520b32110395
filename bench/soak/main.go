// Command soak runs random clients against several pgwake projects for a
// while and checks that nothing was lost: every client connects to a
// project chosen at random, inserts one row and reads its project's count,
// then disconnects and sleeps a random time, long enough now and then for
// the project to fall asleep and be woken by the next client.
//
//	soak -urls urls.txt -duration 30m -clients 8 -max-pause 10s
//
// urls.txt has one connection URL per line, each project's with a table
//
//	create table soak(id bigserial primary key, at timestamptz default now())
//
// made before the run. At the end soak counts each project's rows and
// compares them with the inserts it made; it prints one line,
//
//	soak: clients N, inserts N, rows N, failures N, wakes-seen N
//
// and exits non-zero if any row is missing, any insert failed, or a
// count missed a row whose insert had succeeded before the count began.
// (Visits overlap, so counts need not rise in the order visits end: one
// that read 162 can end after one that read 163.)
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
)

func main() {
	urlsFile := flag.String("urls", "", "file of connection URLs, one a line")
	duration := flag.Duration("duration", 30*time.Minute, "how long clients keep coming")
	clients := flag.Int("clients", 8, "clients at a time")
	maxPause := flag.Duration("max-pause", 10*time.Second, "longest random pause of a client between connections")
	slow := flag.Duration("slow", 500*time.Millisecond, "a connect slower than this counts as a wake seen")
	flag.Parse()
	if *urlsFile == "" || *clients <= 0 || *duration <= 0 || *maxPause <= 0 {
		flag.Usage()
		os.Exit(2)
	}
	urls, err := readLines(*urlsFile)
	if err != nil || len(urls) == 0 {
		fmt.Fprintln(os.Stderr, "soak: no URLs:", err)
		os.Exit(2)
	}
	if err := run(urls, *duration, *clients, *maxPause, *slow); err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		os.Exit(1)
	}
}

func readLines(path string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if l := strings.TrimSpace(sc.Text()); l != "" {
			out = append(out, l)
		}
	}
	return out, sc.Err()
}

// project is one project's expected state: the inserts that succeeded and
// the highest count any client read.
type project struct {
	url     string
	base    int64 // rows before the run
	inserts atomic.Int64
}

func run(urls []string, duration time.Duration, clients int, maxPause, slow time.Duration) error {
	ps := make([]*project, len(urls))
	base := make([]int64, len(urls))
	for i, u := range urls {
		ps[i] = &project{url: u}
		n, err := count(context.Background(), u)
		if err != nil {
			return fmt.Errorf("project %d: count before: %w", i, err)
		}
		base[i] = n
		ps[i].base = n
	}
	var failures, wakes, conns atomic.Int64
	var firstErr sync.Once
	var errMsg atomic.Value
	deadline := time.Now().Add(duration)
	var wg sync.WaitGroup
	for range clients {
		wg.Go(func() {
			for time.Now().Before(deadline) {
				p := ps[rand.IntN(len(ps))]
				start := time.Now()
				n, least, err := visit(p)
				conns.Add(1)
				switch {
				case err != nil:
					failures.Add(1)
					firstErr.Do(func() { errMsg.Store(err.Error()) })
				case n < least:
					failures.Add(1)
					firstErr.Do(func() {
						errMsg.Store(fmt.Sprintf("a count of %d missed rows: %d inserts had succeeded before it began", n, least))
					})
				case time.Since(start) > slow:
					wakes.Add(1)
				}
				// Mostly short pauses, now and then one long enough for
				// the project to be put to sleep.
				pause := time.Duration(rand.Int64N(int64(maxPause) / 10))
				if rand.IntN(10) == 0 {
					pause = time.Duration(rand.Int64N(int64(maxPause)))
				}
				time.Sleep(min(pause, time.Until(deadline)))
			}
		})
	}
	wg.Wait()
	var inserts, rows int64
	missing := 0
	for i, p := range ps {
		n, err := count(context.Background(), p.url)
		if err != nil {
			return fmt.Errorf("project %d: count after: %w", i, err)
		}
		inserts += p.inserts.Load()
		rows += n - base[i]
		if n-base[i] != p.inserts.Load() {
			missing++
			fmt.Fprintf(os.Stderr, "soak: project %d has %d new rows, %d inserts succeeded\n", i, n-base[i], p.inserts.Load())
		}
	}
	fmt.Printf("soak: clients %d, connections %d, inserts %d, rows %d, failures %d, wakes-seen %d\n",
		clients, conns.Load(), inserts, rows, failures.Load(), wakes.Load())
	if msg, ok := errMsg.Load().(string); ok {
		return fmt.Errorf("%d failures, the first: %s", failures.Load(), msg)
	}
	if missing > 0 {
		return fmt.Errorf("%d projects do not have the rows inserted", missing)
	}
	return nil
}

// visit is one client's connection: insert a row, read the count. least
// is what the count must reach: the rows before the run and every insert
// that had succeeded (this one included) when the count was sent.
func visit(p *project) (n, least int64, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, p.url)
	if err != nil {
		return 0, 0, err
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "insert into soak default values"); err != nil {
		return 0, 0, err
	}
	least = p.base + p.inserts.Add(1)
	err = conn.QueryRow(ctx, "select count(*) from soak").Scan(&n)
	return n, least, err
}

func count(ctx context.Context, url string) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return 0, err
	}
	defer conn.Close(context.Background())
	var n int64
	err = conn.QueryRow(ctx, "select count(*) from soak").Scan(&n)
	return n, err
}
