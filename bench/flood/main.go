// Command flood opens many silent TCP connections to the pgwake proxy (a
// socket flood: connections that never send a startup packet) and times a
// real client's connect before, during and after it.
//
//	flood -addr 127.0.0.1:6432 -url postgres://... [-n 19000]
//
// It prints one line per phase with the real client's connect-to-first-row
// latency (median, p95, max), how many silent sockets it opened, how many
// of them pgwake closed to make room, and how many could not be opened.
// The caller samples pgwake's memory around it (bench/flood.sh).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:6432", "proxy address to flood")
	url := flag.String("url", "", "a project's connection URL for the real client")
	n := flag.Int("n", 19000, "silent connections (this process needs n+100 file descriptors)")
	every := flag.Duration("every", 50*time.Millisecond, "real client connect interval")
	flag.Parse()
	if *url == "" {
		flag.Usage()
		os.Exit(2)
	}
	cfg, err := pgconn.ParseConfig(*url)
	if err != nil {
		fmt.Fprintln(os.Stderr, "flood:", err)
		os.Exit(2)
	}
	cfg.RuntimeParams["application_name"] = "pgwake-bench-flood"

	report("idle", probe(cfg, 40, *every, nil), "")

	var opened, failed, closedByProxy atomic.Int64
	var mu sync.Mutex
	var conns []net.Conn
	floodDone := make(chan struct{})
	go func() {
		defer close(floodDone)
		var wg sync.WaitGroup
		for range *n {
			c, err := net.DialTimeout("tcp", *addr, 10*time.Second)
			if err != nil {
				failed.Add(1)
				continue
			}
			opened.Add(1)
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				// A read that returns EOF means pgwake closed the socket.
				if _, err := c.Read(make([]byte, 1)); errors.Is(err, io.EOF) {
					closedByProxy.Add(1)
				}
			}()
		}
	}()
	during := probe(cfg, 0, *every, floodDone)
	report("during flood", during, fmt.Sprintf("opened=%d failed=%d", opened.Load(), failed.Load()))
	held := probe(cfg, 40, *every, nil)
	report("flood held open", held, fmt.Sprintf("closed_by_pgwake=%d", closedByProxy.Load()))

	mu.Lock()
	for _, c := range conns {
		c.Close()
	}
	mu.Unlock()
	report("after", probe(cfg, 40, *every, nil), "")
}

// probe times count connects (or, with count 0, connects until stop is
// closed), one every interval.
func probe(cfg *pgconn.Config, count int, every time.Duration, stop <-chan struct{}) []time.Duration {
	var out []time.Duration
	for i := 0; count == 0 || i < count; i++ {
		if stop != nil {
			select {
			case <-stop:
				return out
			default:
			}
		}
		took, err := once(cfg)
		if err != nil {
			fmt.Fprintln(os.Stderr, "flood: real client:", err)
		} else {
			out = append(out, took)
		}
		time.Sleep(every)
	}
	return out
}

func once(cfg *pgconn.Config) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	c, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		return 0, err
	}
	defer c.Close(context.Background())
	if _, err := c.Exec(ctx, "select 1").ReadAll(); err != nil {
		return 0, err
	}
	return time.Since(start), nil
}

func report(phase string, ds []time.Duration, extra string) {
	if len(ds) == 0 {
		fmt.Printf("%-16s no successful connects %s\n", phase, extra)
		return
	}
	slices.Sort(ds)
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	p := func(q float64) time.Duration { return ds[min(len(ds)-1, int(float64(len(ds))*q))] }
	fmt.Printf("%-16s connects=%d median_ms=%.1f p95_ms=%.1f max_ms=%.1f %s\n",
		phase, len(ds), ms(p(0.5)), ms(p(0.95)), ms(ds[len(ds)-1]), extra)
}
