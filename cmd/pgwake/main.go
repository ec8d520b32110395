// Command pgwake runs scale-to-zero Postgres: a wire-protocol proxy that
// wakes each project's own Postgres server on connect and puts it to sleep
// when idle.
package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"syscall"

	"github.com/pgwake/pgwake/internal/admin"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	err := newRootCommand(defaultDeps()).ExecuteContext(ctx)
	stop()
	os.Exit(exitCode(err, sig))
}

// exitCode prints err once, on one line, and maps it to the process exit
// code: 2 for usage and configuration errors (the daemon's too), 130/143 when a signal ended the run, 1 otherwise.
func exitCode(err error, sig chan os.Signal) int {
	code := 0
	if err != nil {
		fmt.Fprintf(os.Stderr, "pgwake: %s\n", oneLine(err))
		code = 1
		var ee *exitError
		var ae *admin.APIError
		switch {
		case errors.As(err, &ee):
			code = ee.code
		case errors.As(err, &ae) && ae.Status == http.StatusBadRequest:
			code = 2 // the daemon found the request invalid: a bad name or value
		}
	}
	select {
	case s := <-sig:
		if s == syscall.SIGTERM {
			return 143
		}
		return 130
	default:
	}
	return code
}

// exitError carries an exit code other than 1.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

func usageError(err error) error { return &exitError{code: 2, err: err} }
