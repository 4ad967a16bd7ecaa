// Package control serves a pod stack's health and statistics on a unix
// socket, and reads them for the plugin and the status command.
//
// The protocol is HTTP, so an operator can also ask by hand:
//
//	curl --unix-socket /run/cni-usernet/<id>.sock http://stack/status
package control

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"runtime/debug"
	"time"

	"github.com/cni-usernet/cni-usernet/pkg/api/policy"
)

// Protocol is the control protocol's version, which /status reports:
//
//	1  GET /healthz, GET /status
//	2  /status also carries protocol, build, the formats the stack
//	   understands and its health verdict; /healthz means traffic can
//	   flow (the link read, the NIC enabled, the spec's addresses held)
//
// Readers treat an absent protocol as 1.
const Protocol = 2

// Build is the running binary's source revision (vcs.revision, "+dirty"
// when modified), or "" when the build did not record it.
func Build() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return ""
	}
	var rev, dirty string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				dirty = "+dirty"
			}
		}
	}
	if rev == "" {
		return ""
	}
	return rev + dirty
}

// Source provides what the socket serves.
type Source interface {
	// Healthy returns nil when the stack can carry traffic.
	Healthy() error
	// Status returns the stack's state and counters, marshalled as JSON.
	Status() any
}

// Capturer is a Source that also streams packet captures (pkg/cli/capture's
// /capture and /capture/stop). Root only, like the rest of the socket.
type Capturer interface {
	CaptureHandler() http.Handler
}

// PolicySetter is a Source that takes the node agent's network policy
// pushes (PUT /policy, docs/policy.md).
type PolicySetter interface {
	// SetPolicy puts p in force and returns its generation; the error
	// wraps policy.ErrStale for a push older than the policy in force,
	// policy.ErrOff when the stack does not enforce policy.
	SetPolicy(p *policy.PodPolicy) (uint64, error)
}

// maxPolicyBytes bounds a pushed policy: far above a namespace's worth of
// rules and a cluster's Services, far below what would hurt the stack.
const maxPolicyBytes = 32 << 20

// Server is a running control socket.
type Server struct {
	srv  *http.Server
	ln   net.Listener
	path string
}

// Listen creates the socket at path (replacing a stale one left by a
// crashed stack) and serves src on it.
func Listen(path string, src Source) (*Server, error) {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("removing stale control socket %s: %w", path, err)
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listening on %s: %w", path, err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("restricting %s: %w", path, err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		if err := src.Healthy(); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /status", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(src.Status())
	})
	if ps, ok := src.(PolicySetter); ok {
		mux.HandleFunc("PUT /policy", func(w http.ResponseWriter, r *http.Request) { putPolicy(w, r, ps) })
	}
	if c, ok := src.(Capturer); ok {
		h := c.CaptureHandler()
		mux.Handle("GET /capture", h)
		mux.Handle("POST /capture/stop", h)
	}
	// Profiles on demand, for the benchmark's "where does the time go":
	//   curl --unix-socket SOCK http://stack/debug/pprof/profile?seconds=10
	// and the execution trace, for the wake-ups between goroutines that a
	// CPU profile does not show (go tool trace):
	//   curl --unix-socket SOCK http://stack/debug/pprof/trace?seconds=2
	mux.HandleFunc("GET /debug/pprof/", pprof.Index)
	mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
	s := &Server{srv: &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}, ln: ln, path: path}
	go s.srv.Serve(ln)
	return s, nil
}

// putPolicy serves PUT /policy: 200 {"generation": N} once the policy is in
// force; 400 with the reason for a policy the stack cannot read; 409 for
// one older than the policy in force, or when the stack does not enforce
// policy.
func putPolicy(w http.ResponseWriter, r *http.Request, ps PolicySetter) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxPolicyBytes))
	if err != nil {
		http.Error(w, fmt.Sprintf("reading the policy: %v", err), http.StatusBadRequest)
		return
	}
	p, err := policy.Unmarshal(body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	gen, err := ps.SetPolicy(p)
	switch {
	case errors.Is(err, policy.ErrStale), errors.Is(err, policy.ErrOff):
		http.Error(w, err.Error(), http.StatusConflict)
		return
	case err != nil:
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(PolicyReply{Generation: gen})
}

// Close stops serving and removes the socket.
func (s *Server) Close() error {
	err := s.srv.Close()
	os.Remove(s.path)
	return err
}

func client(path string, timeout time.Duration) *http.Client {
	return &http.Client{
		Timeout: timeout,
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, "unix", path)
			},
		},
	}
}

// Health asks the stack at path whether it is healthy.
func Health(path string, timeout time.Duration) error {
	resp, err := client(path, timeout).Get("http://stack/healthz")
	if err != nil {
		return fmt.Errorf("asking stack at %s for health: %w", path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		var msg [512]byte
		n, _ := resp.Body.Read(msg[:])
		return fmt.Errorf("stack at %s unhealthy: %s", path, msg[:n])
	}
	return nil
}

// MaxStatusBytes bounds a stack's /status body as its readers take it:
// the status holds counters, a bounded list of recent denials
// (policy.RecentDenials) and the denials per policy, a few kilobytes to
// tens of them; the bound leaves room for many policies and still keeps
// what a stack that streams without end (subverted, or a bug) costs the
// agent, which asks every stack, to a few megabytes each.
const MaxStatusBytes = 4 << 20

// ErrStatusTooLarge is a /status body longer than MaxStatusBytes.
var ErrStatusTooLarge = fmt.Errorf("status larger than %d bytes", MaxStatusBytes)

// FetchStatus reads the stack's status into st.
func FetchStatus(path string, timeout time.Duration, st *Status) error {
	return FetchStatusInto(path, timeout, st)
}

// FetchStatusInto decodes the stack's status into v of any shape: a
// generic map keeps the fields of a stack of another release that Status
// does not name.
func FetchStatusInto(path string, timeout time.Duration, v any) error {
	resp, err := client(path, timeout).Get("http://stack/status")
	if err != nil {
		return fmt.Errorf("asking stack at %s for status: %w", path, err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(&boundedReader{r: resp.Body, left: MaxStatusBytes}).Decode(v); err != nil {
		return fmt.Errorf("decoding status of stack at %s: %w", path, err)
	}
	return nil
}

// boundedReader reads at most left bytes of r, then fails with
// ErrStatusTooLarge (io.LimitReader's io.EOF would read as a truncated
// body).
type boundedReader struct {
	r    io.Reader
	left int64
}

func (b *boundedReader) Read(p []byte) (int, error) {
	if b.left <= 0 {
		return 0, ErrStatusTooLarge
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.r.Read(p)
	b.left -= int64(n)
	return n, err
}
