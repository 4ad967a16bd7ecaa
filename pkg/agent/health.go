// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"syscall"
	"time"

	"github.com/cni-usernet/cni-usernet/pkg/agent/supervisor"
)

// defaultHealthAddress is where /healthz is served: the node's loopback
// (the kubelet probes a host-network pod there), a port of its own so
// that liveness does not depend on the metrics being on.
const defaultHealthAddress = "127.0.0.1:9436"

// missedReconciles is how many reconcile intervals may pass without a
// pass before the agent is reported wedged: one pass may wait on the
// plugin's locks and a slow node, three in a row do not.
const missedReconciles = 3

// health says whether the agent's supervisor still reconciles the node:
// the liveness probe's verdict. An agent that has not reconciled yet is
// starting (its readiness probe holds the node back meanwhile) and
// counts as alive.
type health struct {
	stats    *supervisor.Stats
	interval time.Duration
	now      func() time.Time
}

func (h health) check() error {
	last := h.stats.LastReconcile.Load()
	if last == 0 {
		return nil
	}
	interval := h.interval
	if interval <= 0 {
		interval = supervisor.DefaultReconcileInterval // the supervisor's own choice for 0
	}
	if age := h.now().Sub(time.Unix(0, last)); age > missedReconciles*interval {
		return fmt.Errorf("no reconcile pass for %s (interval %s)", age.Round(time.Second), interval)
	}
	return nil
}

func (h health) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if err := h.check(); err != nil {
		http.Error(w, "unhealthy: "+err.Error(), http.StatusServiceUnavailable)
		return
	}
	fmt.Fprintln(w, "ok")
}

// serveHealth serves /healthz on addr until the process ends: an agent
// draining the node before it uninstalls stays alive for the kubelet.
// An address in use (an older agent on the node that has not let go
// yet) is taken again every 2 s.
func serveHealth(addr string, h health, log *slog.Logger) error {
	mux := http.NewServeMux()
	mux.Handle("GET /healthz", h)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, WriteTimeout: 5 * time.Second}
	ln, err := net.Listen("tcp", addr)
	if err == nil {
		go srv.Serve(ln)
		return nil
	}
	if !errors.Is(err, syscall.EADDRINUSE) {
		return fmt.Errorf("listening for /healthz on %s: %w", addr, err)
	}
	log.Warn("health address in use, retrying every 2s", "address", addr, "err", err)
	go func() {
		for {
			time.Sleep(2 * time.Second)
			if ln, err := net.Listen("tcp", addr); err == nil {
				log.Info("serving /healthz", "address", addr)
				srv.Serve(ln)
				return
			}
		}
	}()
	return nil
}
