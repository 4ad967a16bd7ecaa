// Package rig is the bench's hold on the machine: the network namespaces
// it makes and the processes it runs in them, each remembered until it is
// undone, so that a run that stops half-way leaves nothing behind.
package rig

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/cni-usernet/cni-usernet/hack/bench/runlog"
)

// NSPrefix begins the name of every namespace the bench makes.
const NSPrefix = "ub-"

// Rig holds the namespaces and servers of one run.
type Rig struct {
	logs string // where servers log

	mu         sync.Mutex // guards the fields below
	namespaces []string   // in the order they were made
	procs      map[*Proc]bool
}

// New returns a rig whose servers log into the directory logs.
func New(logs string) *Rig {
	return &Rig{logs: logs, procs: map[*Proc]bool{}}
}

// AddNS makes network namespace name with its loopback up.
func (r *Rig) AddNS(ctx context.Context, name string) error {
	// Cleanup owns the name before it exists: an `ip netns add` ended by
	// its timeout on a loaded machine can leave the namespace behind.
	r.mu.Lock()
	r.namespaces = append(r.namespaces, name)
	r.mu.Unlock()
	if _, err := Output(ctx, 30*time.Second, "", "ip", "netns", "add", name); err != nil {
		return err
	}
	_, err := Output(ctx, 10*time.Second, "", "ip", "-n", name, "link", "set", "lo", "up")
	return err
}

// delNS ends the processes left in a namespace the rig made (by pid:
// servers, stacks a failed DEL left behind) and deletes it.
func delNS(ctx context.Context, name string) {
	for range 3 {
		out, _ := Output(ctx, 10*time.Second, "", "ip", "netns", "pids", name)
		pids := strings.Fields(string(out))
		if len(pids) == 0 {
			break
		}
		runlog.Logf("ending processes left in %s: %s", name, strings.Join(pids, " "))
		for _, p := range pids {
			if pid, err := strconv.Atoi(p); err == nil && pid > 1 {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	if _, err := Output(ctx, 10*time.Second, "", "ip", "netns", "del", name); err != nil {
		runlog.Logf("cleanup: %v", err)
	}
}

// RemoveNS deletes namespace name (see delNS) and forgets it.
func (r *Rig) RemoveNS(ctx context.Context, name string) {
	r.RemoveNSFunc(ctx, func(ns string) bool { return ns == name })
}

// RemoveNSFunc deletes every namespace of the rig that del picks, then
// forgets them.
func (r *Rig) RemoveNSFunc(ctx context.Context, del func(ns string) bool) {
	r.mu.Lock()
	var nss []string
	for _, ns := range r.namespaces {
		if del(ns) {
			nss = append(nss, ns)
		}
	}
	r.mu.Unlock()
	for _, ns := range nss {
		delNS(ctx, ns)
	}
	r.mu.Lock()
	r.namespaces = slices.DeleteFunc(r.namespaces, del)
	r.mu.Unlock()
}

// StopAll ends every server still running.
func (r *Rig) StopAll() {
	r.mu.Lock()
	procs := make([]*Proc, 0, len(r.procs))
	for p := range r.procs {
		procs = append(procs, p)
	}
	r.mu.Unlock()
	for _, p := range procs {
		r.Stop(p)
	}
}

// RemoveAllNS deletes every namespace still held, the last made first
// (pods before their node).
func (r *Rig) RemoveAllNS(ctx context.Context) {
	r.mu.Lock()
	nss := r.namespaces
	r.namespaces = nil
	r.mu.Unlock()
	for i := len(nss) - 1; i >= 0; i-- {
		delNS(ctx, nss[i])
	}
}
