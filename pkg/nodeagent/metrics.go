package nodeagent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/cni-usernet/cni-usernet/pkg/agent"
	"github.com/cni-usernet/cni-usernet/pkg/metrics"
	"github.com/cni-usernet/cni-usernet/pkg/state"
)

// defaultMetricsAddress is where the agent serves Prometheus metrics; the
// DaemonSet declares the port.
const defaultMetricsAddress = ":9437"

// serveMetrics starts the agent's /metrics endpoint and the drain of the
// plugin's operation log; both end with ctx.
func serveMetrics(ctx context.Context, addr string, store state.Store, stats *agent.Stats, pol *policyMetrics, log *slog.Logger) error {
	starts, err := metrics.CountStart(store.Dir)
	if err != nil {
		log.Warn("agent start count", "err", err)
	}
	c := metrics.New(metrics.Options{Store: store, Agent: stats, AgentStarts: starts, Log: log})
	reg := prometheus.NewRegistry()
	reg.MustRegister(c, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if pol != nil {
		reg.MustRegister(pol.collectors()...)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listening for metrics on %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{
		// Each scrape asks every stack; two at a time is plenty for the
		// Prometheus servers of one cluster.
		MaxRequestsInFlight: 2,
		Timeout:             10 * time.Second,
	}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go c.Run(ctx, 10*time.Second)
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("serving metrics", "err", err)
		}
	}()
	go func() {
		<-ctx.Done()
		srv.Close()
	}()
	log.Info("serving metrics", "address", ln.Addr().String())
	return nil
}
