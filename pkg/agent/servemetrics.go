package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"golang.org/x/net/netutil"

	"github.com/cni-usernet/cni-usernet/pkg/agent/metrics"
	"github.com/cni-usernet/cni-usernet/pkg/agent/noderoutes"
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

const (
	// metricsConns bounds the connections the endpoint serves at once;
	// more wait in the kernel's accept queue. A cluster's Prometheus
	// servers hold one or two each.
	metricsConns = 16
	// metricsRate is how many scrapes a second the endpoint serves, all
	// sources together, with a burst of as many; more wait their turn.
	// A scrape writes a rendering the agent already has, so this is what
	// bounds the agent's CPU under a flood of scrapes, whatever the flood
	// asks for.
	metricsRate = 10
)

// metricsServing is the endpoint's configuration from the agent's flags.
type metricsServing struct {
	addr     string
	interval time.Duration
	// allowPods serves scrapes whose source is in the pod network.
	allowPods bool
	store     state.Store
	stats     *supervisor.Stats
	pol       *policyctl.Metrics
	pods      *podNetwork
	log       *slog.Logger
}

// serveMetrics starts the agent's /metrics endpoint and its collection;
// both end with ctx.
func serveMetrics(ctx context.Context, m metricsServing) error {
	log := m.log
	starts, err := metrics.CountStart(m.store.Dir)
	if err != nil {
		log.Warn("agent start count", "err", err)
	}
	c := metrics.New(metrics.Options{Store: m.store, Agent: m.stats, AgentStarts: starts, Log: log})
	reg := prometheus.NewRegistry()
	reg.MustRegister(c, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if m.pol != nil {
		reg.MustRegister(m.pol.Collectors()...)
	}
	var refused atomic.Uint64
	reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "cni_usernet_metrics_scrapes_refused_total",
		Help: "Connections to the agent's metrics endpoint closed unanswered because their source is in the pod network (--metrics-allow-pod-network=false).",
	}, func() float64 { return float64(refused.Load()) }))
	// Collected on the agent's schedule, never a scrape's: the pod
	// network learnt from the attachments at each collection.
	cache := metrics.NewCache(reg, m.interval, func() { m.pods.setLocal(attachmentPrefixes(m.store)) }, log)
	go cache.Run(ctx)

	ln, err := net.Listen("tcp", m.addr)
	if err != nil && !errors.Is(err, syscall.EADDRINUSE) {
		return fmt.Errorf("listening for metrics on %s: %w", m.addr, err)
	}
	serve := func(ln net.Listener) {
		if !m.allowPods {
			ln = &refusingListener{Listener: ln, refuse: m.pods.contains, refused: &refused}
		}
		serveMetricsOn(ctx, netutil.LimitListener(ln, metricsConns), cache, log)
	}
	if err != nil {
		// An older agent on the node may still hold the port (host
		// network) while it terminates: take it once that one lets go.
		log.Warn("metrics address in use, retrying every 2s", "address", m.addr, "err", err)
		go func() {
			for {
				select {
				case <-ctx.Done():
					return
				case <-time.After(2 * time.Second):
				}
				ln, err := net.Listen("tcp", m.addr)
				if errors.Is(err, syscall.EADDRINUSE) {
					continue
				}
				if err != nil {
					log.Error("no metrics", "err", fmt.Errorf("listening for metrics on %s: %w", m.addr, err))
					return
				}
				serve(ln)
				return
			}
		}()
		return nil
	}
	serve(ln)
	return nil
}

// serveMetricsOn serves the cache's /metrics on ln until ctx ends.
func serveMetricsOn(ctx context.Context, ln net.Listener, cache *metrics.Cache, log *slog.Logger) {
	p := &pacer{every: time.Second / metricsRate, burst: metricsRate}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := p.wait(r.Context()); err != nil {
			http.Error(w, "too many scrapes", http.StatusServiceUnavailable)
			return
		}
		cache.ServeHTTP(w, r)
	}))
	srv := &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 5 * time.Second,
		// A scrape waits its turn (metricsRate) within Prometheus' own
		// default timeout; a client that reads slower is cut off.
		WriteTimeout: 10 * time.Second,
	}
	// One scrape per connection: a connection kept alive would hold one
	// of metricsConns for its client, and the clients beyond them would
	// wait until it idled out. Prometheus scrapes every 15 s or more, so
	// a new connection each time costs it nothing it would notice.
	srv.SetKeepAlivesEnabled(false)
	serveServer(ctx, ln, srv, "metrics", log)
}

// serveHTTP serves h on ln until ctx ends; what names it in the log.
func serveHTTP(ctx context.Context, ln net.Listener, h http.Handler, what string, log *slog.Logger) {
	serveServer(ctx, ln, &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}, what, log)
}

func serveServer(ctx context.Context, ln net.Listener, srv *http.Server, what string, log *slog.Logger) {
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

// pacer lets requests through at one per every, with a burst of burst
// (the generic cell rate algorithm: a theoretical arrival time).
type pacer struct {
	every time.Duration
	burst int
	// mu guards next.
	mu   sync.Mutex
	next time.Time
}

// wait returns when the caller's turn comes, or ctx's error.
func (p *pacer) wait(ctx context.Context) error {
	p.mu.Lock()
	now := time.Now()
	if floor := now.Add(-time.Duration(p.burst) * p.every); p.next.Before(floor) {
		p.next = floor
	}
	at := p.next
	p.next = p.next.Add(p.every)
	p.mu.Unlock()
	d := at.Sub(now)
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// refusingListener closes, unanswered, the connections whose source
// refuse selects.
type refusingListener struct {
	net.Listener
	refuse  func(netip.Addr) bool
	refused *atomic.Uint64
}

func (l *refusingListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		tc, ok := c.(*net.TCPConn)
		if !ok || !l.refuse(tc.RemoteAddr().(*net.TCPAddr).AddrPort().Addr().Unmap()) {
			return c, nil
		}
		// A reset, not a FIN: the agent keeps no TIME_WAIT for it.
		tc.SetLinger(0)
		tc.Close()
		l.refused.Add(1)
	}
}

// podNetwork is the prefixes the agent knows pods' addresses in: the
// pod subnets given to it (--subnet), those of its node's attachments,
// and other nodes' pod CIDRs when it routes between nodes.
type podNetwork struct {
	// mu guards the parts; all is their union, read without it.
	mu                   sync.Mutex
	static, local, nodes []netip.Prefix
	all                  atomic.Pointer[[]netip.Prefix]
}

func newPodNetwork(subnets string) (*podNetwork, error) {
	p := &podNetwork{}
	for s := range strings.SplitSeq(subnets, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		pfx, err := netip.ParsePrefix(s)
		if err != nil {
			return nil, fmt.Errorf("--subnet %q: %w", s, err)
		}
		p.static = append(p.static, pfx.Masked())
	}
	p.update()
	return p, nil
}

func (p *podNetwork) setLocal(pfx []netip.Prefix) {
	p.mu.Lock()
	p.local = pfx
	p.update()
	p.mu.Unlock()
}

// setNodes takes the pod CIDRs of the node list.
func (p *podNetwork) setNodes(nodes []noderoutes.Node) {
	var pfx []netip.Prefix
	for _, n := range nodes {
		pfx = append(pfx, n.PodCIDRs...)
	}
	p.mu.Lock()
	p.nodes = pfx
	p.update()
	p.mu.Unlock()
}

// update recomputes all; mu held (or p not yet shared).
func (p *podNetwork) update() {
	all := slices.Concat(p.static, p.local, p.nodes)
	slices.SortFunc(all, func(a, b netip.Prefix) int {
		if c := a.Addr().Compare(b.Addr()); c != 0 {
			return c
		}
		return a.Bits() - b.Bits()
	})
	all = slices.Compact(all)
	p.all.Store(&all)
}

func (p *podNetwork) contains(a netip.Addr) bool {
	for _, pfx := range *p.all.Load() {
		if pfx.Contains(a) {
			return true
		}
	}
	return false
}

// attachmentPrefixes are the subnets of the node's attachments'
// addresses (state records them as CIDRs: 10.244.1.5/24).
func attachmentPrefixes(store state.Store) []netip.Prefix {
	atts, _ := store.List()
	var out []netip.Prefix
	for _, a := range atts {
		for _, ip := range a.IPs {
			if pfx, err := netip.ParsePrefix(ip); err == nil {
				out = append(out, pfx.Masked())
			}
		}
	}
	return out
}
