// Command conns opens N Postgres connections to one URL and holds them open
// until its standard input reaches EOF, so bench/run.sh can measure what N
// idle client connections cost the proxy in between.
//
//	conns -url postgres://... -n 500
//
// It prints "ready N <seconds>" on stdout once every connection has
// answered a SELECT 1, and exits non-zero if any connection fails.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

func main() {
	url := flag.String("url", "", "connection URL")
	n := flag.Int("n", 500, "connections to open")
	parallel := flag.Int("parallel", 8, "connections opened at once")
	timeout := flag.Duration("timeout", 5*time.Minute, "give up opening after this long")
	flag.Parse()
	if *url == "" || *n <= 0 || *parallel <= 0 {
		flag.Usage()
		os.Exit(2)
	}
	cfg, err := pgconn.ParseConfig(*url)
	if err != nil {
		fmt.Fprintln(os.Stderr, "conns:", err)
		os.Exit(2)
	}
	cfg.RuntimeParams["application_name"] = "pgwake-bench-conns"

	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	start := time.Now()
	conns := make([]*pgconn.PgConn, *n)
	errs := make([]error, *n)
	sem := make(chan struct{}, *parallel)
	var wg sync.WaitGroup
	for i := range conns {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			c, err := pgconn.ConnectConfig(ctx, cfg)
			if err != nil {
				errs[i] = err
				return
			}
			conns[i] = c
			if _, err := c.Exec(ctx, "select 1").ReadAll(); err != nil {
				errs[i] = err
			}
		}()
	}
	wg.Wait()
	failed := 0
	for i, err := range errs {
		if err != nil {
			if failed < 5 {
				fmt.Fprintf(os.Stderr, "conns: connection %d: %v\n", i, err)
			}
			failed++
		}
	}
	closeAll := func() {
		cctx, ccancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer ccancel()
		for _, c := range conns {
			if c != nil {
				c.Close(cctx)
			}
		}
	}
	if failed > 0 {
		closeAll()
		fmt.Fprintf(os.Stderr, "conns: %d of %d connections failed\n", failed, *n)
		os.Exit(1)
	}
	fmt.Printf("ready %d %.2f\n", *n, time.Since(start).Seconds())
	_, _ = io.Copy(io.Discard, os.Stdin)
	closeAll()
}
