// SPDX-License-Identifier: Apache-2.0

package docs

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"
)

// agentContainer is the agent's container of a render's DaemonSet.
func agentContainer(t *testing.T, objs map[string]map[string]any) map[string]any {
	t.Helper()
	for k, o := range objs {
		if strings.HasPrefix(k, "DaemonSet/") {
			return get(o, "spec", "template", "spec", "containers").([]any)[0].(map[string]any)
		}
	}
	t.Fatal("no DaemonSet rendered")
	return nil
}

func argsOf(c map[string]any) []string {
	var out []string
	for _, a := range c["args"].([]any) {
		out = append(out, a.(string))
	}
	return out
}

// The values that fit the chart to a real cluster reach the agent as the
// flags they name, and at their defaults pass nothing (the manifest's
// arguments): routes and VXLAN, the pods' subnets, the stacks' defaults,
// extra arguments and environment, the liveness port.
func TestChartAgentFlags(t *testing.T) {
	base := argsOf(agentContainer(t, render(t, "cni-usernet")))
	for _, c := range []struct {
		set  string
		want []string
	}{
		{"nodeRoutes.enabled=false", []string{"--node-routes=false"}},
		{"nodeRoutes.encapsulation=vxlan,nodeRoutes.vxlanPort=8472,nodeRoutes.vxlanVNI=7", []string{"--encapsulation=vxlan", "--vxlan-port=8472", "--vxlan-vni=7"}},
		{"podSubnets={10.244.0.0/24,fd00:10:244::/64}", []string{"--subnet=10.244.0.0/24,fd00:10:244::/64"}},
		{"stack.cgroup=node,stack.busyPoll=0s,stack.threads=2,stack.socketRedirect=both", []string{"--stack-cgroup=node", "--busy-poll=0s", "--stack-threads=2", "--socket-redirect=both"}},
		{"livenessProbe.port=9500", []string{"--health-address=127.0.0.1:9500"}},
		{"extraArgs={--reconcile-interval=1m,--pprof-address=127.0.0.1:6060}", []string{"--reconcile-interval=1m", "--pprof-address=127.0.0.1:6060"}},
	} {
		got := argsOf(agentContainer(t, render(t, "cni-usernet", c.set)))
		var added []string
		for _, a := range got {
			if !slices.Contains(base, a) {
				added = append(added, a)
			}
		}
		if !slices.Equal(added, c.want) {
			t.Errorf("--set %s: the agent gets %v beside the defaults' arguments, want %v", c.set, added, c.want)
		}
		// extraArgs come last, where a repeated flag wins.
		if strings.HasPrefix(c.set, "extraArgs") && !slices.Equal(got[len(got)-len(c.want):], c.want) {
			t.Errorf("--set %s: extraArgs not last: %v", c.set, got)
		}
	}
	for _, a := range base {
		for _, f := range []string{"--node-routes", "--encapsulation", "--vxlan-port", "--vxlan-vni", "--subnet", "--stack-cgroup", "--busy-poll", "--stack-threads", "--socket-redirect", "--health-address"} {
			if strings.HasPrefix(a, f+"=") {
				t.Errorf("defaults pass %s: a value at the agent's default passes nothing", a)
			}
		}
	}
}

// Every flag the chart can pass, with every value set, is one the agent
// defines: a flag it does not know stops it at start on every node.
func TestChartFlagsExist(t *testing.T) {
	known := map[string]bool{}
	for _, f := range agentFlags(t) {
		known["--"+f.name] = true
	}
	objs := render(t, "net", "mode=chain", "mtu=1450", "gso=software", "networkPolicy.enabled=false", "metrics.allowPodNetwork=true",
		"nodeRoutes.enabled=true,nodeRoutes.encapsulation=vxlan,nodeRoutes.vxlanPort=8472,nodeRoutes.vxlanVNI=7",
		"podSubnets={10.244.0.0/24}", "stack.cgroup=node,stack.busyPoll=0s,stack.threads=2,stack.socketRedirect=both", "livenessProbe.port=9500")
	for _, a := range argsOf(agentContainer(t, objs)) {
		name, _, _ := strings.Cut(a, "=")
		if !known[name] {
			t.Errorf("the chart passes %s, which pkg/agent does not define", a)
		}
	}
}

// extraEnv reaches the agent's container after NODE_NAME.
func TestChartExtraEnv(t *testing.T) {
	c := agentContainer(t, render(t, "cni-usernet", "extraEnv[0].name=GODEBUG,extraEnv[0].value=madvdontneed=1"))
	var names []string
	for _, e := range c["env"].([]any) {
		names = append(names, fmt.Sprint(get(e, "name"), "=", get(e, "value")))
	}
	if want := []string{"NODE_NAME=<nil>", "GODEBUG=madvdontneed=1"}; !slices.Equal(names, want) {
		t.Errorf("env %v, want %v", names, want)
	}
}

// The pod-level fields: Linux nodes only by default, the update
// strategy as given (OnDelete without a rollingUpdate, which the API
// refuses), and the liveness probe on the node's loopback, off on ask.
func TestChartPodFields(t *testing.T) {
	objs := render(t, "cni-usernet")
	ds := objs["DaemonSet/net/cni-usernet"]
	if ns := fmt.Sprint(get(ds, "spec", "template", "spec", "nodeSelector")); ns != "map[kubernetes.io/os:linux]" {
		t.Errorf("default nodeSelector %s, want kubernetes.io/os: linux", ns)
	}
	if s := fmt.Sprint(get(ds, "spec", "updateStrategy")); s != "map[rollingUpdate:map[maxUnavailable:1] type:RollingUpdate]" {
		t.Errorf("default updateStrategy %s", s)
	}
	lp := agentContainer(t, objs)["livenessProbe"]
	if h := fmt.Sprint(get(lp, "httpGet")); h != "map[host:127.0.0.1 path:/healthz port:9436]" {
		t.Errorf("livenessProbe.httpGet %s, want 127.0.0.1:9436/healthz", h)
	}
	objs = render(t, "cni-usernet", "updateStrategy.type=OnDelete", "livenessProbe.enabled=false", "nodeSelector=null")
	ds = objs["DaemonSet/net/cni-usernet"]
	if s := fmt.Sprint(get(ds, "spec", "updateStrategy")); s != "map[type:OnDelete]" {
		t.Errorf("updateStrategy.type=OnDelete: %s", s)
	}
	if lp := agentContainer(t, objs)["livenessProbe"]; lp != nil {
		t.Errorf("livenessProbe.enabled=false: probe %v", lp)
	}
	if ns := get(ds, "spec", "template", "spec", "nodeSelector"); ns != nil {
		t.Errorf("nodeSelector=null: %v", ns)
	}
}

// serviceAccount.create and rbac.create leave out what a cluster manages
// itself, and the agent runs as the ServiceAccount named.
func TestChartServiceAccountAndRBAC(t *testing.T) {
	kinds := func(objs map[string]map[string]any) []string {
		var k []string
		for key := range objs {
			k = append(k, key[:strings.Index(key, "/")])
		}
		sort.Strings(k)
		return k
	}
	for _, c := range []struct {
		set   []string
		kinds []string
		sa    string
	}{
		{nil, []string{"ClusterRole", "ClusterRoleBinding", "DaemonSet", "ServiceAccount"}, "cni-usernet"},
		{[]string{"serviceAccount.name=net-agent"}, []string{"ClusterRole", "ClusterRoleBinding", "DaemonSet", "ServiceAccount"}, "net-agent"},
		{[]string{"serviceAccount.create=false,serviceAccount.name=net-agent"}, []string{"ClusterRole", "ClusterRoleBinding", "DaemonSet"}, "net-agent"},
		{[]string{"rbac.create=false"}, []string{"DaemonSet", "ServiceAccount"}, "cni-usernet"},
	} {
		objs := render(t, "cni-usernet", c.set...)
		if k := kinds(objs); !slices.Equal(k, c.kinds) {
			t.Errorf("%v: rendered %v, want %v", c.set, k, c.kinds)
		}
		ds := objs["DaemonSet/net/cni-usernet"]
		if sa := get(ds, "spec", "template", "spec", "serviceAccountName"); sa != c.sa {
			t.Errorf("%v: the agent runs as %v, want %s", c.set, sa, c.sa)
		}
		if o, ok := objs["ServiceAccount/net/"+c.sa]; !ok && slices.Contains(c.kinds, "ServiceAccount") {
			t.Errorf("%v: no ServiceAccount %s (%v)", c.set, c.sa, o)
		}
		if crb, ok := objs["ClusterRoleBinding//cni-usernet"]; ok {
			if s := get(crb, "subjects").([]any)[0]; get(s, "name") != c.sa {
				t.Errorf("%v: the binding's subject %v, want %s", c.set, s, c.sa)
			}
		}
	}
}

// The ServiceMonitor only where the cluster serves its API: a cluster
// without the Prometheus Operator installs without an unknown kind.
func TestChartServiceMonitorNeedsItsAPI(t *testing.T) {
	out, err := helm(t, "template", "cni-usernet", chart, "--namespace", "net", "--skip-tests", "--set", "metrics.serviceMonitor.enabled=true")
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, out)
	}
	objs := objects(t, out)
	if _, ok := objs["ServiceMonitor/net/cni-usernet"]; ok {
		t.Errorf("a ServiceMonitor without monitoring.coreos.com/v1")
	}
	if _, ok := objs["Service/net/cni-usernet-metrics"]; !ok {
		t.Errorf("no metrics Service without monitoring.coreos.com/v1")
	}
	if _, ok := render(t, "cni-usernet", "metrics.serviceMonitor.enabled=true")["ServiceMonitor/net/cni-usernet"]; !ok {
		t.Errorf("no ServiceMonitor with monitoring.coreos.com/v1")
	}
}

// `helm test`'s pod: a hook, on the pod network (attached by
// cni-usernet, not the host's), from the agent's image, on the agents'
// nodes, unprivileged.
func TestChartTestPod(t *testing.T) {
	out, err := helmTemplate(t, "cni-usernet", chart, "--namespace", "net", "--skip-tests=false", "--set", "image.tag=v9")
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, out)
	}
	objs := objects(t, out)
	pod, ok := objs["Pod/net/cni-usernet-test-pod-network"]
	if !ok {
		t.Fatalf("no test pod in %v", slices.Sorted(func(yield func(string) bool) {
			for k := range objs {
				if !yield(k) {
					return
				}
			}
		}))
	}
	if h := get(pod, "metadata", "annotations", "helm.sh/hook"); h != "test" {
		t.Errorf("helm.sh/hook %v, want test", h)
	}
	spec := get(pod, "spec").(map[string]any)
	if spec["hostNetwork"] == true {
		t.Errorf("the test pod is on the host network: it must be attached by the plugin")
	}
	c := spec["containers"].([]any)[0].(map[string]any)
	if img, want := c["image"], agentContainer(t, objs)["image"]; img != want {
		t.Errorf("test image %v, the agent's %v", img, want)
	}
	if fmt.Sprint(spec["nodeSelector"]) != "map[kubernetes.io/os:linux]" {
		t.Errorf("test pod nodeSelector %v", spec["nodeSelector"])
	}
	if get(c, "securityContext", "allowPrivilegeEscalation") != false {
		t.Errorf("the test pod may escalate privileges")
	}
}

// Chart.yaml names the Kubernetes versions the chart installs on.
func TestChartKubeVersion(t *testing.T) {
	meta := readJSONish(t, chart+"/Chart.yaml")
	if kv, _ := meta["kubeVersion"].(string); !strings.HasPrefix(kv, ">=1.29") {
		t.Errorf("Chart.yaml kubeVersion %q, want >=1.29…", kv)
	}
	out, err := helm(t, "template", "cni-usernet", chart, "--kube-version", "1.28.0")
	if err == nil || !strings.Contains(out, "kubeVersion") {
		t.Errorf("helm template --kube-version 1.28.0: want a refusal naming kubeVersion, got %v\n%s", err, out)
	}
}
