package admin

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"syscall"
)

// ErrNotRunning means no daemon answers on the admin socket.
var ErrNotRunning = errors.New("pgwake is not running")

// Client talks to a daemon's admin socket.
type Client struct {
	socket string
	hc     *http.Client
}

// NewClient returns a client for the admin socket at path.
func NewClient(socket string) *Client {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		},
	}
	// The API never redirects: a redirect is the mux cleaning a path with
	// a dot segment, and following it would send the request elsewhere.
	noRedirect := func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return &Client{socket: socket, hc: &http.Client{Transport: tr, CheckRedirect: noRedirect}}
}

// APIError is an error the daemon returned.
type APIError struct {
	Status int
	Msg    string
}

func (e *APIError) Error() string { return e.Msg }

func (c *Client) do(ctx context.Context, method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	resp, err := c.send(ctx, method, path, rd)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		return nil
	}
	return json.NewDecoder(resp.Body).Decode(out)
}

func (c *Client) send(ctx context.Context, method, path string, body io.Reader) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, method, "http://pgwake"+path, body)
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		if errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ECONNREFUSED) {
			return nil, fmt.Errorf("%w (no daemon on %s; start it with: pgwake up)", ErrNotRunning, c.socket)
		}
		return nil, fmt.Errorf("admin api: %w", err)
	}
	if resp.StatusCode >= 300 {
		defer resp.Body.Close()
		var eb errorBody
		data, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		if json.Unmarshal(data, &eb) != nil || eb.Error == "" {
			eb.Error = strings.TrimSpace(string(data))
		}
		return nil, &APIError{Status: resp.StatusCode, Msg: eb.Error}
	}
	return resp, nil
}

// Healthy reports whether a daemon answers.
func (c *Client) Healthy(ctx context.Context) error {
	resp, err := c.send(ctx, http.MethodGet, "/healthz", nil)
	if err != nil {
		return err
	}
	resp.Body.Close()
	return nil
}

// Info returns the daemon's description.
func (c *Client) Info(ctx context.Context) (Info, error) {
	var i Info
	err := c.do(ctx, http.MethodGet, APIPrefix+"/info", nil, &i)
	return i, err
}

// Projects lists projects.
func (c *Client) Projects(ctx context.Context) ([]Project, error) {
	var ps []Project
	err := c.do(ctx, http.MethodGet, APIPrefix+"/projects", nil, &ps)
	return ps, err
}

// Project returns one project.
func (c *Client) Project(ctx context.Context, name string) (Project, error) {
	var p Project
	err := c.do(ctx, http.MethodGet, APIPrefix+"/projects/"+url.PathEscape(name), nil, &p)
	return p, err
}

// Create creates a project.
func (c *Client) Create(ctx context.Context, req CreateRequest) (Project, error) {
	var p Project
	err := c.do(ctx, http.MethodPost, APIPrefix+"/projects", req, &p)
	return p, err
}

// Remove removes a project, and its data with volumes.
func (c *Client) Remove(ctx context.Context, name string, volumes bool) error {
	return c.do(ctx, http.MethodDelete, APIPrefix+"/projects/"+url.PathEscape(name)+"?volumes="+strconv.FormatBool(volumes), nil, nil)
}

// Action runs wake, sleep, pin or unpin on a project.
func (c *Client) Action(ctx context.Context, name, action string) (Project, error) {
	var p Project
	err := c.do(ctx, http.MethodPost, APIPrefix+"/projects/"+url.PathEscape(name)+"/"+action, nil, &p)
	return p, err
}

// Snapshot keeps a consistent copy of a project's data.
func (c *Client) Snapshot(ctx context.Context, name string, req SnapshotRequest) (Snapshot, error) {
	var s Snapshot
	err := c.do(ctx, http.MethodPost, APIPrefix+"/projects/"+url.PathEscape(name)+"/snapshots", req, &s)
	return s, err
}

// Snapshots lists a project's snapshots, oldest first.
func (c *Client) Snapshots(ctx context.Context, name string) ([]Snapshot, error) {
	var s []Snapshot
	err := c.do(ctx, http.MethodGet, APIPrefix+"/projects/"+url.PathEscape(name)+"/snapshots", nil, &s)
	return s, err
}

// DeleteSnapshot removes one of a project's snapshots.
func (c *Client) DeleteSnapshot(ctx context.Context, name, label string) error {
	if label == "." || label == ".." {
		// No path segment can carry it.
		return &APIError{Status: http.StatusBadRequest, Msg: fmt.Sprintf("snapshot label %q is not a label", label)}
	}
	return c.do(ctx, http.MethodDelete, APIPrefix+"/projects/"+url.PathEscape(name)+"/snapshots/"+url.PathEscape(label), nil, nil)
}

// Reset puts a project's data back to a snapshot and returns which.
func (c *Client) Reset(ctx context.Context, name string, req ResetRequest) (Snapshot, error) {
	var s Snapshot
	err := c.do(ctx, http.MethodPost, APIPrefix+"/projects/"+url.PathEscape(name)+"/reset", req, &s)
	return s, err
}

// SetPassword changes a project's password and returns the project.
func (c *Client) SetPassword(ctx context.Context, name string, req PasswordRequest) (Project, error) {
	var p Project
	err := c.do(ctx, http.MethodPost, APIPrefix+"/projects/"+url.PathEscape(name)+"/password", req, &p)
	return p, err
}

// Logs streams a project's server log.
func (c *Client) Logs(ctx context.Context, name string, follow bool, tail int) (io.ReadCloser, error) {
	q := url.Values{"follow": {strconv.FormatBool(follow)}, "tail": {strconv.Itoa(tail)}}
	resp, err := c.send(ctx, http.MethodGet, APIPrefix+"/projects/"+url.PathEscape(name)+"/logs?"+q.Encode(), nil)
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

// Shutdown asks the daemon to stop; with volumes it removes every project
// and its data first.
func (c *Client) Shutdown(ctx context.Context, volumes bool) error {
	return c.do(ctx, http.MethodPost, APIPrefix+"/shutdown?volumes="+strconv.FormatBool(volumes), nil, nil)
}

// Events subscribes to the daemon's event stream. The channel closes when
// ctx ends or the stream breaks (the daemon went away); the caller may
// subscribe again.
func (c *Client) Events(ctx context.Context) (<-chan StreamEvent, error) {
	resp, err := c.send(ctx, http.MethodGet, APIPrefix+"/events", nil)
	if err != nil {
		return nil, err
	}
	out := make(chan StreamEvent, 16)
	go func() {
		defer close(out)
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 64<<10), 4<<20)
		var typ string
		for sc.Scan() {
			line := sc.Text()
			switch {
			case strings.HasPrefix(line, "event: "):
				typ = strings.TrimPrefix(line, "event: ")
			case strings.HasPrefix(line, "data: "):
				ev := StreamEvent{Type: typ}
				if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &ev.Project); err != nil {
					return
				}
				select {
				case out <- ev:
				case <-ctx.Done():
					return
				}
			}
		}
	}()
	return out, nil
}
