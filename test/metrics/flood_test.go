// SPDX-License-Identifier: Apache-2.0

package metrics

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/cni-usernet/cni-usernet/pkg/api/state"

	"github.com/cni-usernet/cni-usernet/test/lib/nettest"
	"github.com/cni-usernet/cni-usernet/test/lib/promcheck"
)

// TestScrapeFlood: many scrapes at once cost neither the pod's stack nor
// the agent more than the agent's own schedule does, every scrape from
// the node is still answered, and a pod's scrape is refused.
func TestScrapeFlood(t *testing.T) {
	env := nettest.NewEnv(t)
	t.Cleanup(func() { env.AssertNoLeaks(t) })
	pod := env.NewPod(env.Conf("1.0.0", nil))

	// The pod's control socket goes through a proxy that counts the
	// status requests its stack gets.
	store := state.Store{Dir: filepath.Join(env.Dir, "state")}
	att, err := store.Load(pod.ID, "eth0")
	if err != nil {
		t.Fatal(err)
	}
	var statusAsks atomic.Int64
	proxySock := filepath.Join(env.Dir, "status-proxy.sock")
	ln, err := net.Listen("unix", proxySock)
	if err != nil {
		t.Fatal(err)
	}
	real := att.ControlSocket
	rp := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) { r.SetURL(&url.URL{Scheme: "http", Host: "stack"}) },
		Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", real)
		}},
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/status" {
			statusAsks.Add(1)
		}
		rp.ServeHTTP(w, r)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	att.ControlSocket = proxySock
	if err := store.Save(att); err != nil {
		t.Fatal(err)
	}
	// DEL at cleanup reaches the stack at its own socket.
	t.Cleanup(func() {
		if a, err := store.Load(pod.ID, "eth0"); err == nil {
			a.ControlSocket = real
			store.Save(a)
		}
	})

	const interval = time.Second
	agent := env.StartAgent(t, "--metrics-address", ":9437", "--metrics-interval", interval.String())
	scrape(t, env) // the first collection is made

	const (
		scrapers = 64
		run      = 5 * time.Second
	)
	client := &http.Client{Timeout: 15 * time.Second, Transport: &http.Transport{
		MaxIdleConnsPerHost: scrapers,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return nettest.Dial(env.Node, network, addr, 5*time.Second)
		},
	}}
	t.Cleanup(client.CloseIdleConnections)
	cpu0 := cpuSeconds(t, agent.PID())
	asks0 := statusAsks.Load()
	start := time.Now()
	var (
		wg             sync.WaitGroup
		served, failed atomic.Int64
		firstErr       sync.Once
		failure        error
	)
	for range scrapers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Since(start) < run {
				_, err := promcheck.Get(client, "http://"+metricsAddr+"/metrics")
				if err != nil {
					failed.Add(1)
					firstErr.Do(func() { failure = err })
					continue
				}
				served.Add(1)
			}
		}()
	}
	wg.Wait()
	took := time.Since(start)
	cpu := cpuSeconds(t, agent.PID()) - cpu0
	asks := statusAsks.Load() - asks0
	t.Logf("%d scrapers for %s: %d served, %d failed; the stack asked for its status %d times; the agent spent %.2f s of CPU",
		scrapers, took.Round(time.Millisecond), served.Load(), failed.Load(), asks, cpu)

	if failed.Load() > 0 {
		t.Errorf("scrapes from the node: %d of %d failed (first: %v), want none", failed.Load(), failed.Load()+served.Load(), failure)
	}
	// One collection per interval asks the stack once; two for the
	// collections at either end of the run.
	if want := int64(took/interval) + 2; asks > want {
		t.Errorf("status requests at the stack during the flood: got %d, want at most %d (one per %s)", asks, want, interval)
	}
	// A generous bound: serving renderings it already has at the
	// endpoint's pace costs the agent a small fraction of a core.
	if limit := 0.25 * took.Seconds(); cpu > limit {
		t.Errorf("agent CPU during the flood: got %.2f s in %s, want at most %.2f s (a quarter of a core)", cpu, took.Round(time.Millisecond), limit)
	}

	// From the pod: closed unanswered, and counted.
	podClient := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return nettest.Dial(pod.NS, network, addr, 5*time.Second)
		},
	}}
	podURL := "http://" + nettest.HostPort(pod.Gateway(4), 9437) + "/metrics"
	for i := range 3 {
		if s, err := promcheck.Get(podClient, podURL); err == nil {
			t.Errorf("scrape %d from the pod at %s: got %d bytes, want the connection refused", i, podURL, len(s.Body))
		}
	}
	waitFor(t, env, "the pod's scrapes counted as refused", func(fams map[string]*dto.MetricFamily) error {
		if v, _ := value(t, fams, "cni_usernet_metrics_scrapes_refused_total", nil); v < 3 {
			return fmt.Errorf("refused scrapes: got %v, want ≥ 3", v)
		}
		return nil
	})
}

// cpuSeconds is pid's CPU time (user and system) so far.
func cpuSeconds(t *testing.T, pid int) float64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	utime, _ := strconv.ParseUint(f[11], 10, 64)
	stime, _ := strconv.ParseUint(f[12], 10, 64)
	return float64(utime+stime) / 100 // USER_HZ
}
