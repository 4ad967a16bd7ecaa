package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/cni-usernet/cni-usernet/pkg/agent/metrics"
	"github.com/cni-usernet/cni-usernet/pkg/agent/policyctl"
	"github.com/cni-usernet/cni-usernet/pkg/agent/supervisor"
	"github.com/cni-usernet/cni-usernet/pkg/api/state"
)

// defaultMetricsAddress is where the agent serves Prometheus metrics. The
// DaemonSet does not declare the port: on a host-network pod that makes it
// a host port, and the scheduler then keeps a new agent off a node while
// an old one terminates (an uninstall deferred, then the manifest applied
// again).
const defaultMetricsAddress = ":9437"

// serveMetrics starts the agent's /metrics endpoint and the drain of the
// plugin's operation log; both end with ctx.
func serveMetrics(ctx context.Context, addr string, store state.Store, stats *supervisor.Stats, pol *policyctl.Metrics, log *slog.Logger) error {
	starts, err := metrics.CountStart(store.Dir)
	if err != nil {
		log.Warn("agent start count", "err", err)
	}
	c := metrics.New(metrics.Options{Store: store, Agent: stats, AgentStarts: starts, Log: log})
	reg := prometheus.NewRegistry()
	reg.MustRegister(c, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if pol != nil {
		reg.MustRegister(pol.Collectors()...)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil && !errors.Is(err, syscall.EADDRINUSE) {
		return fmt.Errorf("listening for metrics on %s: %w", addr, err)
	}
	go c.Run(ctx, 10*time.Second)
	if err != nil {
		// An older agent on the node may still hold the port (host
		// network) while it terminates: take it once that one lets go.
		log.Warn("metrics address in use, retrying every 2s", "address", addr, "err", err)
		go func() {
			for {
				select {
				case <-ctx.Done():
					return
				case <-time.After(2 * time.Second):
				}
				ln, err := net.Listen("tcp", addr)
				if errors.Is(err, syscall.EADDRINUSE) {
					continue
				}
				if err != nil {
					log.Error("no metrics", "err", fmt.Errorf("listening for metrics on %s: %w", addr, err))
					return
				}
				serveMetricsOn(ctx, ln, reg, log)
				return
			}
		}()
		return nil
	}
	serveMetricsOn(ctx, ln, reg, log)
	return nil
}

// serveMetricsOn serves /metrics on ln until ctx ends.
func serveMetricsOn(ctx context.Context, ln net.Listener, reg *prometheus.Registry, log *slog.Logger) {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{
		// Each scrape asks every stack; two at a time is plenty for the
		// Prometheus servers of one cluster.
		MaxRequestsInFlight: 2,
		Timeout:             10 * time.Second,
	}))
	serveHTTP(ctx, ln, mux, "metrics", log)
}

// serveHTTP serves h on ln until ctx ends; what names it in the log.
func serveHTTP(ctx context.Context, ln net.Listener, h http.Handler, what string, log *slog.Logger) {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("serving "+what, "err", err)
		}
	}()
	go func() {
		<-ctx.Done()
		srv.Close()
	}()
	log.Info("serving "+what, "address", ln.Addr().String())
}
