package admin

import (
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"
)

// Handler serves the admin API for svc.
func Handler(svc Service) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if err := svc.Ready(r.Context()); err != nil {
			http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET "+APIPrefix+"/events", func(w http.ResponseWriter, r *http.Request) {
		serveEvents(w, r, svc)
	})
	mux.HandleFunc("GET "+APIPrefix+"/info", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, svc.Info())
	})
	mux.HandleFunc("GET "+APIPrefix+"/projects", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, svc.Projects())
	})
	mux.HandleFunc("POST "+APIPrefix+"/projects", func(w http.ResponseWriter, r *http.Request) {
		var req CreateRequest
		// Init scripts travel in the request (base64 in JSON: 4/3).
		dec := json.NewDecoder(io.LimitReader(r.Body, 1<<20+MaxInitBytes*4/3))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&req); err != nil {
			writeError(w, Invalid(err))
			return
		}
		p, err := svc.Create(r.Context(), req)
		if err != nil {
			writeError(w, err)
			return
		}
		writeJSON(w, http.StatusCreated, p)
	})
	mux.HandleFunc("GET "+APIPrefix+"/projects/{name}", func(w http.ResponseWriter, r *http.Request) {
		p, err := svc.Project(r.PathValue("name"))
		if err != nil {
			writeError(w, err)
			return
		}
		writeJSON(w, http.StatusOK, p)
	})
	mux.HandleFunc("DELETE "+APIPrefix+"/projects/{name}", func(w http.ResponseWriter, r *http.Request) {
		volumes := r.URL.Query().Get("volumes") == "true"
		if err := svc.Remove(r.Context(), r.PathValue("name"), volumes); err != nil {
			writeError(w, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	action := func(fn func(r *http.Request, name string) error) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			name := r.PathValue("name")
			if err := fn(r, name); err != nil {
				writeError(w, err)
				return
			}
			p, err := svc.Project(name)
			if err != nil {
				writeError(w, err)
				return
			}
			writeJSON(w, http.StatusOK, p)
		}
	}
	mux.HandleFunc("POST "+APIPrefix+"/projects/{name}/wake", action(func(r *http.Request, n string) error { return svc.Wake(r.Context(), n) }))
	mux.HandleFunc("POST "+APIPrefix+"/projects/{name}/sleep", action(func(r *http.Request, n string) error { return svc.Sleep(r.Context(), n) }))
	mux.HandleFunc("POST "+APIPrefix+"/projects/{name}/pin", action(func(r *http.Request, n string) error { return svc.Pin(n, true) }))
	mux.HandleFunc("POST "+APIPrefix+"/projects/{name}/unpin", action(func(r *http.Request, n string) error { return svc.Pin(n, false) }))
	mux.HandleFunc("GET "+APIPrefix+"/projects/{name}/logs", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		tail, _ := strconv.Atoi(q.Get("tail"))
		follow := q.Get("follow") == "true"
		rc, err := svc.Logs(r.Context(), r.PathValue("name"), follow, tail)
		if err != nil {
			writeError(w, err)
			return
		}
		defer rc.Close()
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.WriteHeader(http.StatusOK)
		// Flush each chunk so `pgwake logs -f` shows lines as they come.
		fw := flushWriter{w: w}
		fw.flush()
		io.Copy(fw, rc)
	})
	mux.HandleFunc("GET "+APIPrefix+"/projects/{name}/snapshots", func(w http.ResponseWriter, r *http.Request) {
		snaps, err := svc.Snapshots(r.Context(), r.PathValue("name"))
		if err != nil {
			writeError(w, err)
			return
		}
		if snaps == nil {
			snaps = []Snapshot{}
		}
		writeJSON(w, http.StatusOK, snaps)
	})
	mux.HandleFunc("POST "+APIPrefix+"/projects/{name}/snapshots", func(w http.ResponseWriter, r *http.Request) {
		var req SnapshotRequest
		if !decode(w, r, &req) {
			return
		}
		snap, err := svc.Snapshot(r.Context(), r.PathValue("name"), req)
		if err != nil {
			writeError(w, err)
			return
		}
		writeJSON(w, http.StatusCreated, snap)
	})
	mux.HandleFunc("DELETE "+APIPrefix+"/projects/{name}/snapshots/{label}", func(w http.ResponseWriter, r *http.Request) {
		if err := svc.DeleteSnapshot(r.Context(), r.PathValue("name"), r.PathValue("label")); err != nil {
			writeError(w, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("POST "+APIPrefix+"/projects/{name}/reset", func(w http.ResponseWriter, r *http.Request) {
		var req ResetRequest
		if !decode(w, r, &req) {
			return
		}
		snap, err := svc.Reset(r.Context(), r.PathValue("name"), req)
		if err != nil {
			writeError(w, err)
			return
		}
		writeJSON(w, http.StatusOK, snap)
	})
	mux.HandleFunc("POST "+APIPrefix+"/projects/{name}/password", func(w http.ResponseWriter, r *http.Request) {
		var req PasswordRequest
		if !decode(w, r, &req) {
			return
		}
		p, err := svc.SetPassword(r.Context(), r.PathValue("name"), req)
		if err != nil {
			writeError(w, err)
			return
		}
		writeJSON(w, http.StatusOK, p)
	})
	mux.HandleFunc("POST "+APIPrefix+"/shutdown", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusAccepted)
		svc.Shutdown(r.URL.Query().Get("volumes") == "true")
	})
	return mux
}

// decode reads a JSON request body into v (an empty body leaves v as it
// is), answering 400 and returning false when it is not one.
func decode(w http.ResponseWriter, r *http.Request, v any) bool {
	dec := json.NewDecoder(io.LimitReader(r.Body, 1<<20))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil && !errors.Is(err, io.EOF) {
		writeError(w, Invalid(err))
		return false
	}
	return true
}

// keepalive is how often an idle event stream gets a comment line, so
// proxies and clients notice a dead connection.
const keepalive = 15 * time.Second

// serveEvents streams server-sent events: "event: project" with a
// Project's JSON, or "event: removed".
func serveEvents(w http.ResponseWriter, r *http.Request, svc Service) {
	fl, ok := w.(http.Flusher)
	if !ok {
		http.Error(w, "streaming unsupported", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	fl.Flush()
	events := svc.Subscribe(r.Context())
	tick := time.NewTicker(keepalive)
	defer tick.Stop()
	for {
		select {
		case <-r.Context().Done():
			return
		case <-tick.C:
			if _, err := io.WriteString(w, ": keepalive\n\n"); err != nil {
				return
			}
		case ev, ok := <-events:
			if !ok {
				return
			}
			data, err := json.Marshal(ev.Project)
			if err != nil {
				return
			}
			if _, err := fmt.Fprintf(w, "event: %s\ndata: %s\n\n", ev.Type, data); err != nil {
				return
			}
		}
		fl.Flush()
	}
}

type flushWriter struct{ w http.ResponseWriter }

func (f flushWriter) Write(p []byte) (int, error) {
	n, err := f.w.Write(p)
	f.flush()
	return n, err
}

func (f flushWriter) flush() {
	if fl, ok := f.w.(http.Flusher); ok {
		fl.Flush()
	}
}

type errorBody struct {
	Error string `json:"error"`
}

func writeError(w http.ResponseWriter, err error) {
	code := http.StatusInternalServerError
	switch {
	case errors.Is(err, ErrNotFound):
		code = http.StatusNotFound
	case errors.Is(err, ErrConflict):
		code = http.StatusConflict
	case errors.Is(err, ErrInvalid):
		code = http.StatusBadRequest
	}
	writeJSON(w, code, errorBody{Error: err.Error()})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

// RequireToken guards h with a bearer token; an empty token lets every
// request through (loopback only: config refuses it beyond). /healthz stays
// open for probes.
func RequireToken(token string, h http.Handler) http.Handler {
	if token == "" {
		return h
	}
	want := []byte("Bearer " + token)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Probes carry no token (a kubelet's httpGet cannot read a Secret);
		// they learn only whether pgwake serves.
		if r.URL.Path != "/healthz" && r.URL.Path != "/readyz" && subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), want) != 1 {
			w.Header().Set("WWW-Authenticate", "Bearer")
			writeJSON(w, http.StatusUnauthorized, errorBody{Error: "missing or wrong bearer token"})
			return
		}
		h.ServeHTTP(w, r)
	})
}
