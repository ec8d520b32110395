// Command firstrow times connect + "SELECT 1" to the first row, in process,
// so the number excludes the cost of starting a client program.
//
//	firstrow -url postgres://... [-n 1]
//
// It prints one line per attempt: the milliseconds from the start of the
// TCP connect to the first row of SELECT 1 (simple query protocol, one
// round trip, like psql -c), then closes the connection.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

func main() {
	url := flag.String("url", "", "connection URL")
	n := flag.Int("n", 1, "attempts, one after another")
	timeout := flag.Duration("timeout", 90*time.Second, "per attempt")
	flag.Parse()
	if *url == "" || *n <= 0 {
		flag.Usage()
		os.Exit(2)
	}
	cfg, err := pgconn.ParseConfig(*url)
	if err != nil {
		fmt.Fprintln(os.Stderr, "firstrow:", err)
		os.Exit(2)
	}
	cfg.RuntimeParams["application_name"] = "pgwake-bench-firstrow"
	for range *n {
		ms, err := once(cfg, *timeout)
		if err != nil {
			fmt.Fprintln(os.Stderr, "firstrow:", err)
			os.Exit(1)
		}
		fmt.Printf("%.3f\n", ms)
	}
}

func once(cfg *pgconn.Config, timeout time.Duration) (float64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	start := time.Now()
	c, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		return 0, err
	}
	defer c.Close(context.Background())
	res, err := c.Exec(ctx, "select 1").ReadAll()
	if err != nil {
		return 0, err
	}
	took := time.Since(start)
	if len(res) != 1 || len(res[0].Rows) != 1 || string(res[0].Rows[0][0]) != "1" {
		return 0, fmt.Errorf("unexpected result %v", res)
	}
	return float64(took.Microseconds()) / 1000, nil
}
