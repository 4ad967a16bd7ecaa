package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cni-usernet/cni-usernet/pkg/api/state"
)

// fakeStacks stand in for the local pods' stacks: one unix socket each,
// answering the control protocol the agent pushes policies over (PUT
// /policy: the generation in force; GET /status and /healthz), and
// counting every push. The harness process is each stack's process in the
// attachment records (StackPID, StackStartTime), so the agent's supervisor
// sees them alive and leaves them be.
type fakeStacks struct {
	mu   sync.Mutex // guards the fields below
	pods []*fakeStack
	log  []push // every push, in arrival order
}

// push is one PUT /policy a stack took.
type push struct {
	pod   int
	bytes int
	at    time.Time
}

type fakeStack struct {
	gen uint64 // the generation in force; guarded by fakeStacks.mu
}

// localAttachment is what a local pod's attachment record names.
type localAttachment struct {
	containerID string
	ns, name    string
	ip          string
}

// start writes an attachment record per local pod in stateDir and serves
// its control socket in runDir.
func (f *fakeStacks) start(ctx context.Context, stateDir, runDir string, pods []localAttachment) error {
	pid := os.Getpid()
	start, err := processStartTime(pid)
	if err != nil {
		return err
	}
	store := state.Store{Dir: stateDir}
	for i, p := range pods {
		key := state.Key(p.containerID, "eth0")
		dir := filepath.Join(stateDir, "stacks", key)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return fmt.Errorf("creating %s: %w", dir, err)
		}
		sock := filepath.Join(runDir, key+".sock")
		a := &state.Attachment{
			Network: "cni-usernet", ContainerID: p.containerID, IfName: "eth0",
			PodNS: p.ns, PodName: p.name, Created: time.Now(),
			IPs:      []string{p.ip + "/16"},
			StackPID: pid, StackStartTime: start,
			ConfigPath: filepath.Join(dir, "config.json"), SpecPath: filepath.Join(dir, "spec.json"),
			ControlSocket: sock, LogPath: filepath.Join(runDir, key+".log"),
			PolicyPath: filepath.Join(dir, "policy.json"),
		}
		if err := store.Save(a); err != nil {
			return err
		}
		if err := f.serve(ctx, i, sock); err != nil {
			return err
		}
	}
	return nil
}

func (f *fakeStacks) serve(ctx context.Context, i int, sock string) error {
	ln, err := net.Listen("unix", sock)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", sock, err)
	}
	st := &fakeStack{}
	f.mu.Lock()
	f.pods = append(f.pods, st)
	f.mu.Unlock()
	mux := http.NewServeMux()
	mux.HandleFunc("PUT /policy", func(w http.ResponseWriter, r *http.Request) { f.put(w, r, i, st) })
	mux.HandleFunc("GET /status", func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		gen := st.gen
		f.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]any{"policy": map[string]any{"generation": gen}})
	})
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok\n") })
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	go func() { <-ctx.Done(); srv.Close() }()
	return nil
}

// put takes a push: its generation must be above the one in force (409
// otherwise, as a stack answers), and becomes it.
func (f *fakeStacks) put(w http.ResponseWriter, r *http.Request, i int, st *fakeStack) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var p struct {
		Generation uint64 `json:"generation"`
	}
	if err := json.Unmarshal(body, &p); err != nil {
		http.Error(w, "reading the policy: "+err.Error(), http.StatusBadRequest)
		return
	}
	f.mu.Lock()
	f.log = append(f.log, push{pod: i, bytes: len(body), at: time.Now()})
	if p.Generation <= st.gen && st.gen != 0 {
		held := st.gen
		f.mu.Unlock()
		http.Error(w, fmt.Sprintf("stale policy: generation %d, holding %d", p.Generation, held), http.StatusConflict)
		return
	}
	st.gen = p.Generation
	f.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(map[string]uint64{"generation": p.Generation})
}

// pushesSince returns the pushes from index n on, and the index to pass
// next.
func (f *fakeStacks) pushesSince(n int) ([]push, int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := append([]push(nil), f.log[n:]...)
	return out, len(f.log)
}

// pushTally sums pushes: pods touched, bytes and the largest push.
type pushTally struct {
	pushes, pods, bytes, max int
	last                     time.Time
}

func tally(ps []push) pushTally {
	var t pushTally
	seen := map[int]bool{}
	for _, p := range ps {
		t.pushes++
		t.bytes += p.bytes
		t.max = max(t.max, p.bytes)
		if !seen[p.pod] {
			seen[p.pod] = true
			t.pods++
		}
		if p.at.After(t.last) {
			t.last = p.at
		}
	}
	return t
}

// processStartTime is field 22 of /proc/PID/stat: what the supervisor
// compares to tell a live stack from a reused PID.
func processStartTime(pid int) (uint64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0, errors.New("malformed /proc/PID/stat")
	}
	fields := strings.Fields(string(b[i+1:]))
	if len(fields) < 20 {
		return 0, errors.New("short /proc/PID/stat")
	}
	return strconv.ParseUint(fields[19], 10, 64)
}
