package metrics

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/cni-usernet/cni-usernet/pkg/agent/supervisor"
	"github.com/cni-usernet/cni-usernet/pkg/api/agentapi"
	"github.com/cni-usernet/cni-usernet/pkg/api/control"
	"github.com/cni-usernet/cni-usernet/pkg/api/offload"
	"github.com/cni-usernet/cni-usernet/pkg/api/policy"
	"github.com/cni-usernet/cni-usernet/pkg/api/state"
	"github.com/cni-usernet/cni-usernet/pkg/node/launch"
)

// A pod whose stack is not running still has its identity, GSO and
// supervision series, reported down; node series and the plugin's
// operations come from the state directory; everything lints clean.
func TestCollectWithoutStacks(t *testing.T) {
	store := state.Store{Dir: t.TempDir()}
	att := &state.Attachment{
		Version: state.Version, ContainerID: "c0ffee", IfName: "eth0", PodNS: "ns1", PodName: "web",
		StackPID:      0, // no stack process
		ControlSocket: store.Dir + "/none.sock",
		GSO:           offload.Decision{Requested: offload.ModeAuto, Mode: offload.ModeSoftware, Link: offload.LinkGSO{MaxSize: 65536, MaxSegs: 64}},
		Supervision:   &state.Supervision{Restarts: 3, Unhealthy: "crash loop: …"},
	}
	if err := store.Save(att); err != nil {
		t.Fatal(err)
	}
	for _, r := range []agentapi.Record{{Verb: "ADD", Result: agentapi.ResultSuccess, Duration: 80 * time.Millisecond}, {Verb: "DEL", Result: agentapi.ResultError, Duration: time.Millisecond}} {
		if err := agentapi.Append(store.Dir, r); err != nil {
			t.Fatal(err)
		}
	}
	var stats supervisor.Stats
	stats.ReconcileRuns.Add(2)
	stats.ReclaimedByReconcile.Add(1)
	c := New(Options{Store: store, Agent: &stats, AgentStarts: 4})

	problems, err := testutil.CollectAndLint(c)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("promlint: %s: %s", p.Metric, p.Text)
	}
	// CollectAndLint drained the operation log: the histogram keeps them.
	pod := `{container_id="c0ffee",gso_mode="software",interface="eth0",namespace="ns1",pod="web"}`
	want := `
# HELP cni_usernet_pod_stack_up Whether the pod's stack answered its status query in this scrape (1) or not (0).
# TYPE cni_usernet_pod_stack_up gauge
cni_usernet_pod_stack_up` + pod + ` 0
# HELP cni_usernet_pod_stack_restarts_total Times the node agent restarted the pod's stack since ADD.
# TYPE cni_usernet_pod_stack_restarts_total counter
cni_usernet_pod_stack_restarts_total` + pod + ` 3
# HELP cni_usernet_pod_stack_crash_loop Whether the pod's stack is in a crash loop (1): it died too often in a row shortly after starting.
# TYPE cni_usernet_pod_stack_crash_loop gauge
cni_usernet_pod_stack_crash_loop` + pod + ` 1
# HELP cni_usernet_pod_gso_info The pod's GSO decision: requested is what the pod asked for (annotation, conflist or default auto), gso_mode what its stack runs.
# TYPE cni_usernet_pod_gso_info gauge
cni_usernet_pod_gso_info{container_id="c0ffee",gso_mode="software",interface="eth0",namespace="ns1",pod="web",requested="auto"} 1
# HELP cni_usernet_attachments Pods attached on this node (state files).
# TYPE cni_usernet_attachments gauge
cni_usernet_attachments 1
# HELP cni_usernet_reconcile_runs_total Reconcile passes of the node agent since it started.
# TYPE cni_usernet_reconcile_runs_total counter
cni_usernet_reconcile_runs_total 2
# HELP cni_usernet_agent_starts_total Times a node agent started on this node (kept in the state directory across agent restarts).
# TYPE cni_usernet_agent_starts_total counter
cni_usernet_agent_starts_total 4
`
	names := []string{"cni_usernet_pod_stack_up", "cni_usernet_pod_stack_restarts_total", "cni_usernet_pod_stack_crash_loop",
		"cni_usernet_pod_gso_info", "cni_usernet_attachments", "cni_usernet_reconcile_runs_total", "cni_usernet_agent_starts_total"}
	if err := testutil.CollectAndCompare(c, strings.NewReader(want), names...); err != nil {
		t.Error(err)
	}
	if n := testutil.CollectAndCount(c, "cni_usernet_pod_bytes_total"); n != 0 {
		t.Errorf("byte series of a pod whose stack is down: got %d, want 0", n)
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var adds, dels uint64
	for _, f := range fams {
		if f.GetName() != "cni_usernet_plugin_operation_duration_seconds" {
			continue
		}
		for _, m := range f.GetMetric() {
			l := m.GetLabel()
			switch l[0].GetValue() + " " + l[1].GetValue() {
			case "ADD success":
				adds = m.GetHistogram().GetSampleCount()
			case "DEL error":
				dels = m.GetHistogram().GetSampleCount()
			}
		}
	}
	if adds != 1 || dels != 1 {
		t.Errorf("operations: got %d ADD success and %d DEL error, want 1 and 1", adds, dels)
	}

	// Its state gone (DEL), so are its series.
	if err := store.Delete(att.ContainerID, att.IfName); err != nil {
		t.Fatal(err)
	}
	if n := testutil.CollectAndCount(c, "cni_usernet_pod_stack_up"); n != 0 {
		t.Errorf("series after the attachment's removal: got %d, want 0", n)
	}
}

func TestReadProc(t *testing.T) {
	st, err := launch.StartTime(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	u, err := readProc(os.Getpid(), st)
	if err != nil {
		t.Fatal(err)
	}
	if u.rssBytes < 1<<20 || u.cpuSeconds < 0 {
		t.Errorf("own usage: got %+v, want RSS ≥ 1 MiB", u)
	}
	if _, err := readProc(os.Getpid(), st+1); err == nil {
		t.Errorf("another start time: got no error, want the process reported gone")
	}
}

func TestCountStart(t *testing.T) {
	dir := t.TempDir()
	for want := uint64(1); want <= 3; want++ {
		n, err := CountStart(dir)
		if err != nil || n != want {
			t.Fatalf("start %d: got %d, %v", want, n, err)
		}
	}
}

// emitter is one pod's series as a collector.
type emitter struct{ p pod }

func (e emitter) Describe(ch chan<- *prometheus.Desc) { prometheus.DescribeByCollect(e, ch) }
func (e emitter) Collect(ch chan<- prometheus.Metric) { e.p.emit(ch) }

// TestPolicySeries: a stack that enforces policy has its generation and
// its denials per direction and policy label; one that does not has
// neither.
func TestPolicySeries(t *testing.T) {
	att := &state.Attachment{Version: state.Version, ContainerID: "c0ffee", IfName: "eth0", PodNS: "ns1", PodName: "web",
		GSO: offload.Decision{Requested: offload.ModeAuto, Mode: offload.ModeHardware}}
	st := &control.Status{Policy: &policy.Status{Generation: 7, IngressIsolated: true, EgressIsolated: true,
		Denied: policy.Denied{Ingress: map[string]uint64{"ns1/db,ns1/deny-all": 3}, Egress: map[string]uint64{"(pending)": 1}}}}
	c := emitter{pod{att: att, status: st}}
	if problems, err := testutil.CollectAndLint(c); err != nil || len(problems) > 0 {
		t.Fatalf("promlint: %v %v", problems, err)
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range fams {
		for _, m := range f.GetMetric() {
			key := f.GetName()
			for _, l := range m.GetLabel() {
				if n := l.GetName(); n == "direction" || n == "policy" {
					key += " " + n + "=" + l.GetValue()
				}
			}
			switch {
			case m.GetCounter() != nil:
				got[key] = m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				got[key] = m.GetGauge().GetValue()
			}
		}
	}
	for key, v := range map[string]float64{
		"cni_usernet_pod_policy_denied_total direction=ingress policy=ns1/db,ns1/deny-all": 3,
		"cni_usernet_pod_policy_denied_total direction=egress policy=(pending)":            1,
		"cni_usernet_pod_policy_generation":                                                7,
	} {
		if got[key] != v {
			t.Errorf("%s: got %v, want %v", key, got[key], v)
		}
	}
	for _, name := range []string{"cni_usernet_pod_busy_poll_active", "cni_usernet_pod_busy_poll_enabled_total"} {
		if n := testutil.CollectAndCount(c, name); n != 0 {
			t.Errorf("stack without busy polling: got %d series of %s, want none", n, name)
		}
	}
	st.Policy = nil
	if n := testutil.CollectAndCount(c, "cni_usernet_pod_policy_denied_total", "cni_usernet_pod_policy_generation"); n != 0 {
		t.Errorf("stack without policy: got %d policy series, want none", n)
	}
}

// TestGovernorSeries: a stack's thread count and, when its governor
// switches busy polling, whether it polls now and how often it was
// turned on.
func TestGovernorSeries(t *testing.T) {
	att := &state.Attachment{Version: state.Version, ContainerID: "c0ffee", IfName: "eth0", PodNS: "ns1", PodName: "web",
		GSO: offload.Decision{Requested: offload.ModeAuto, Mode: offload.ModeHardware}}
	st := &control.Status{Threads: control.ThreadsStatus{Threads: 2, Max: 2, Adaptive: true},
		BusyPoll: &control.BusyPollStatus{Window: "200µs", Auto: true, On: true, Enabled: 5}}
	c := emitter{pod{att: att, status: st}}
	if problems, err := testutil.CollectAndLint(c); err != nil || len(problems) > 0 {
		t.Fatalf("promlint: %v %v", problems, err)
	}
	want := `
# HELP cni_usernet_pod_busy_poll_active Whether the pod stack's thread busy-polls after traffic now (1) or sleeps (0); absent when busy polling is off for the pod.
# TYPE cni_usernet_pod_busy_poll_active gauge
cni_usernet_pod_busy_poll_active{container_id="c0ffee",gso_mode="hardware",interface="eth0",namespace="ns1",pod="web"} 1
# HELP cni_usernet_pod_busy_poll_enabled_total Times the stack's governor turned busy polling on: requests flowed on one thread and the node had idle CPU.
# TYPE cni_usernet_pod_busy_poll_enabled_total counter
cni_usernet_pod_busy_poll_enabled_total{container_id="c0ffee",gso_mode="hardware",interface="eth0",namespace="ns1",pod="web"} 5
# HELP cni_usernet_pod_stack_threads Threads running the pod stack's Go code now (its GOMAXPROCS): one, and more while bulk traffic saturates them when the count is left to the stack's governor.
# TYPE cni_usernet_pod_stack_threads gauge
cni_usernet_pod_stack_threads{container_id="c0ffee",gso_mode="hardware",interface="eth0",namespace="ns1",pod="web"} 2
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(want), "cni_usernet_pod_busy_poll_active",
		"cni_usernet_pod_busy_poll_enabled_total", "cni_usernet_pod_stack_threads"); err != nil {
		t.Error(err)
	}
}
