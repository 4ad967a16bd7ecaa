package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/cni-usernet/cni-usernet/test/lib/promcheck"
)

// agentMetricsURL is node 1's agent, which serves on the node's host
// network (the DaemonSet's --metrics-address=:9437); the test runs on
// node 1, so loopback reaches it.
const agentMetricsURL = "http://127.0.0.1:9437/metrics"

// scrapeAgent scrapes node 1's agent, retrying while it (re)starts.
func scrapeAgent(t *testing.T) *promcheck.Scrape {
	t.Helper()
	var s *promcheck.Scrape
	eventually(t, time.Minute, "a scrape of the agent", func() error {
		var err error
		s, err = promcheck.Get(nil, agentMetricsURL)
		return err
	})
	return s
}

// scrapeAfterCollection scrapes node 1's agent until its scrape has
// counted the pods' traffic: the agent collects on its own schedule
// (--metrics-interval), so a scrape right after the traffic may show the
// collection before it.
func scrapeAfterCollection(t *testing.T, ns string, pods map[string]string) *promcheck.Scrape {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		s := scrapeAgent(t)
		counted := true
		for name := range pods {
			for _, ms := range [][]string{{"wire", "ingress"}, {"wire", "egress"}, {"app", "ingress"}, {"app", "egress"}} {
				f := s.Find("cni_usernet_pod_bytes_total", map[string]string{"namespace": ns, "pod": name, "leg": ms[0], "direction": ms[1]})
				if len(f) != 1 || promcheck.Value(f[0]) == 0 {
					counted = false
				}
			}
		}
		if counted || time.Now().After(deadline) {
			return s
		}
		time.Sleep(time.Second)
	}
}

// checkPodMetrics: after the pods exchanged traffic, the agent's scrape
// is lint-clean and shows every pod's series with non-zero byte counters
// on both legs, both ways, labelled with the GSO mode the pod asked for
// (annotation) or auto resolved to, as `cni-usernet status` reports it.
func checkPodMetrics(t *testing.T, ns string, pods map[string]string) {
	s := scrapeAfterCollection(t, ns, pods)
	problems, checked, err := s.Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Error(p)
	}
	t.Logf("scrape checked with %s", checked)
	st := nodeStatus(t)
	for name, asked := range pods {
		row := st[ns+"/"+name]
		requested := asked
		if requested == "" {
			requested = "auto"
		}
		for _, leg := range []string{"wire", "app"} {
			for _, dir := range []string{"ingress", "egress"} {
				ms := s.Find("cni_usernet_pod_bytes_total", map[string]string{"namespace": ns, "pod": name, "leg": leg, "direction": dir})
				if len(ms) != 1 {
					t.Errorf("%s: %d series of bytes %s/%s, want 1", name, len(ms), leg, dir)
					continue
				}
				if v := promcheck.Value(ms[0]); v == 0 {
					t.Errorf("%s: bytes %s/%s is 0 after traffic", name, leg, dir)
				}
				l := promcheck.Labels(ms[0])
				if l["gso_mode"] != row.GSO.Mode || (asked != "" && l["gso_mode"] != asked) {
					t.Errorf("%s (asked %q): gso_mode label %q, status says %q", name, asked, l["gso_mode"], row.GSO.Mode)
				}
				if l["container_id"] != row.ContainerID || l["interface"] != "eth0" {
					t.Errorf("%s: labels %v, want container_id %s, interface eth0", name, l, row.ContainerID)
				}
			}
		}
		info := s.Find("cni_usernet_pod_gso_info", map[string]string{"namespace": ns, "pod": name})
		if len(info) != 1 || promcheck.Labels(info[0])["requested"] != requested {
			t.Errorf("%s: gso_info %v, want one series with requested=%q", name, info, requested)
		}
		if up := s.Find("cni_usernet_pod_stack_up", map[string]string{"namespace": ns, "pod": name}); len(up) != 1 || promcheck.Value(up[0]) != 1 {
			t.Errorf("%s: stack_up %v, want 1", name, up)
		}
	}
	adds := s.Find("cni_usernet_plugin_operation_duration_seconds", map[string]string{"operation": "ADD", "result": "success"})
	if len(adds) != 1 || adds[0].GetHistogram().GetSampleCount() < uint64(len(pods)) {
		t.Errorf("plugin ADD successes: %v, want ≥ %d", adds, len(pods))
	}
	t.Logf("scrape sample:\n%s", s.Grep(`namespace="`+ns+`"`))
}

// checkDeletedPodMetrics: once the DEL of the pods not kept ran, their
// series are gone from the scrape, the kept ones' remain.
func checkDeletedPodMetrics(t *testing.T, ns string, pods map[string]string, keep map[string]bool) {
	var deleted, kept []string
	for name := range pods {
		if keep[name] {
			kept = append(kept, name)
		} else {
			deleted = append(deleted, name)
		}
	}
	var s *promcheck.Scrape
	eventually(t, 30*time.Second, "the deleted pods' series gone", func() error {
		s = scrapeAgent(t)
		for _, name := range deleted {
			if ms := s.Find("cni_usernet_pod_stack_up", map[string]string{"namespace": ns, "pod": name}); len(ms) != 0 {
				return fmt.Errorf("%s deleted, its series still scraped:\n%s", name, s.Grep(`pod="`+name+`"`))
			}
		}
		return nil
	})
	for _, name := range kept {
		if ms := s.Find("cni_usernet_pod_stack_up", map[string]string{"namespace": ns, "pod": name}); len(ms) != 1 {
			t.Errorf("%s kept, but %d stack_up series", name, len(ms))
		}
	}
	dels := s.Find("cni_usernet_plugin_operation_duration_seconds", map[string]string{"operation": "DEL", "result": "success"})
	if len(dels) != 1 || dels[0].GetHistogram().GetSampleCount() < uint64(len(deleted)) {
		t.Errorf("plugin DEL successes: %v, want ≥ %d", dels, len(deleted))
	}
	t.Logf("after DEL of %s:\n%s", strings.Join(deleted, ", "), s.Grep(`namespace="`+ns+`"`))
}
