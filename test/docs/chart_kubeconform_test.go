package docs

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// kubeconformBinary is $KUBECONFORM, else bin/kubeconform (`make
// kubeconform`, pinned in hack/helm). As with helm: without either the test
// skips, unless KUBECONFORM names a file that is not there (make test sets
// it).
func kubeconformBinary(t *testing.T) string {
	t.Helper()
	if k := os.Getenv("KUBECONFORM"); k != "" {
		if _, err := os.Stat(k); err != nil {
			t.Fatalf("KUBECONFORM=%s: %v (make kubeconform builds bin/kubeconform)", k, err)
		}
		return k
	}
	k, err := filepath.Abs(filepath.Join(repo, "bin/kubeconform"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(k); err != nil {
		t.Skip("no kubeconform: `make kubeconform` builds bin/kubeconform from hack/helm (make test does)")
	}
	return k
}

// labKubernetes is the Kubernetes release the lab runs (hack/k8s/toolmod
// pins it): the API the chart's objects are checked against.
func labKubernetes(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repo, "hack/k8s/toolmod/go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^require k8s\.io/kubernetes (v\S+)`).FindSubmatch(b)
	if m == nil {
		t.Fatal("hack/k8s/toolmod/go.mod: no `require k8s.io/kubernetes vX.Y.Z` line")
	}
	return string(m[1])
}

// kubeSchemas writes JSON schemas for kubeconform, one file per kind
// (kubeconform's layout: <kind>[-<group's first label>]-<version>.json,
// refs into _definitions.json), from the OpenAPI document of the lab's
// Kubernetes (api/openapi-spec/swagger.json in its module, which `make
// cluster-up` downloads anyway). Strict, as kubeconform's
// openapi2jsonschema --strict: an object with properties takes no other
// field, so a misspelt or misplaced field fails.
func kubeSchemas(t *testing.T) string {
	t.Helper()
	version := labKubernetes(t)
	cmd := exec.Command("go", "mod", "download", "-json", "k8s.io/kubernetes@"+version)
	cmd.Dir = t.TempDir() // outside any module
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go mod download k8s.io/kubernetes@%s: %v\n%s", version, err, out)
	}
	var mod struct{ Dir string }
	if err := json.Unmarshal(out, &mod); err != nil || mod.Dir == "" {
		t.Fatalf("go mod download -json: %v\n%s", err, out)
	}
	b, err := os.ReadFile(filepath.Join(mod.Dir, "api/openapi-spec/swagger.json"))
	if err != nil {
		t.Fatal(err)
	}
	var spec struct {
		Definitions map[string]any `json:"definitions"`
	}
	if err := json.Unmarshal(b, &spec); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	defs := map[string]any{}
	for name, d := range spec.Definitions {
		defs[name] = jsonSchema(d, "")
	}
	// resource.Quantity is written as a string or a number (cpu: 1).
	defs["io.k8s.apimachinery.pkg.api.resource.Quantity"] = map[string]any{
		"oneOf": []any{map[string]any{"type": "string"}, map[string]any{"type": "number"}},
	}
	write := func(name string, v any) {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("_definitions.json", map[string]any{"definitions": defs})
	kinds := 0
	for name, d := range spec.Definitions {
		gvks, _ := d.(map[string]any)["x-kubernetes-group-version-kind"].([]any)
		for _, g := range gvks {
			g := g.(map[string]any)
			group, version, kind := g["group"].(string), g["version"].(string), g["kind"].(string)
			suffix := "-" + version
			if group != "" {
				suffix = "-" + strings.ToLower(strings.Split(group, ".")[0]) + suffix
			}
			write(strings.ToLower(kind)+suffix+".json", jsonSchema(spec.Definitions[name], "_definitions.json"))
			kinds++
		}
	}
	if kinds < 50 {
		t.Fatalf("swagger.json of k8s.io/kubernetes@%s: only %d kinds", version, kinds)
	}
	return dir
}

// jsonSchema turns an OpenAPI v2 schema into a JSON schema for kubeconform:
// refs point into file (or stay in the document when file is ""), an
// int-or-string takes either, formats are dropped (OpenAPI's int32, byte …
// are no JSON Schema formats), and objects with properties are closed.
func jsonSchema(v any, file string) any {
	s, ok := v.(map[string]any)
	if !ok {
		return v
	}
	out := map[string]any{}
	for k, x := range s {
		switch k {
		case "$ref":
			out[k] = file + x.(string)
		case "format", "description", "x-kubernetes-group-version-kind":
		case "properties":
			props := map[string]any{}
			for name, p := range x.(map[string]any) {
				props[name] = jsonSchema(p, file)
			}
			out[k] = props
		case "items", "additionalProperties", "not":
			out[k] = jsonSchema(x, file)
		case "allOf", "anyOf", "oneOf":
			var l []any
			for _, y := range x.([]any) {
				l = append(l, jsonSchema(y, file))
			}
			out[k] = l
		default:
			out[k] = x
		}
	}
	if s["format"] == "int-or-string" {
		delete(out, "type")
		out["oneOf"] = []any{map[string]any{"type": "string"}, map[string]any{"type": "integer"}}
	}
	if _, ok := s["properties"]; ok {
		if _, ok := s["additionalProperties"]; !ok {
			out["additionalProperties"] = false
		}
	}
	return out
}

// chartCombinations are the values that change what the chart renders:
// mode × NetworkPolicy × metrics, and each settable pod field on its own
// (then all together), as -f values files.
var chartCombinations = func() map[string]string {
	c := map[string]string{}
	for _, mode := range []string{"standalone", "chain"} {
		for _, pol := range []bool{true, false} {
			for _, met := range []string{"on", "off", "serviceMonitor"} {
				v := fmt.Sprintf("mode: %s\nnetworkPolicy: {enabled: %t}\n", mode, pol)
				switch met {
				case "off":
					v += "metrics: {enabled: false}\n"
				case "serviceMonitor":
					v += "metrics: {address: 10.0.0.1, port: 9500, serviceMonitor: {enabled: true, labels: {release: prometheus}}}\n"
				}
				c[fmt.Sprintf("%s-policy=%t-metrics=%s", mode, pol, met)] = v
			}
		}
	}
	fields := map[string]string{
		"securityContext":   "securityContext: {privileged: true, readOnlyRootFilesystem: true, seccompProfile: {type: Unconfined}}\n",
		"priorityClassName": "priorityClassName: \"\"\n",
		"affinity": "affinity: {nodeAffinity: {requiredDuringSchedulingIgnoredDuringExecution: {nodeSelectorTerms: [" +
			"{matchExpressions: [{key: kubernetes.io/os, operator: In, values: [linux]}]}]}}}\n",
		"nodeSelector":     "nodeSelector: {kubernetes.io/os: linux}\n",
		"tolerations":      "tolerations: [{key: node-role.kubernetes.io/control-plane, operator: Exists, effect: NoSchedule}, {key: k, operator: Equal, value: v, effect: NoExecute, tolerationSeconds: 30}]\n",
		"imagePullSecrets": "imagePullSecrets: [{name: regcred}]\n",
		"podAnnotations":   "podAnnotations: {example.com/a: \"1\"}\n",
		"podLabels":        "podLabels: {example.com/team: net}\n",
		"resources":        "resources: {requests: {cpu: 1, memory: 64Mi}, limits: {cpu: \"2\", memory: 1Gi}}\n",
		"image":            "image: {repository: registry.example/cni-usernet, digest: \"sha256:" + strings.Repeat("0f", 32) + "\", pullPolicy: Always}\n",
		"names":            "fullnameOverride: usernet\n",
		"nodeRoutes":       "nodeRoutes: {enabled: \"true\", encapsulation: vxlan, vxlanPort: 8472, vxlanVNI: 7}\npodSubnets: [10.244.0.0/24, \"fd00:10:244::/64\"]\n",
		"stack":            "stack: {cgroup: node, busyPoll: 0s, threads: 2, socketRedirect: \"on\"}\n",
		"extra":            "extraArgs: [--reconcile-interval=1m, --pprof-address=127.0.0.1:6060]\nextraEnv: [{name: GODEBUG, value: madvdontneed=1}, {name: POD_IP, valueFrom: {fieldRef: {fieldPath: status.podIP}}}]\n",
		"serviceAccount":   "serviceAccount: {create: false, name: network-agent}\nrbac: {create: false}\n",
		"probes":           "livenessProbe: {enabled: true, port: 9500, periodSeconds: 5, failureThreshold: 3}\nupdateStrategy: {type: RollingUpdate, rollingUpdate: {maxUnavailable: 10%}}\n",
		"onDelete":         "updateStrategy: {type: OnDelete}\nlivenessProbe: {enabled: false}\nclusterNetworkPolicy: {enabled: false}\n",
	}
	all := ""
	for k, v := range fields {
		c["field-"+k] = v
		if k != "priorityClassName" && k != "onDelete" {
			all += v
		}
	}
	c["fields-all"] = all
	return c
}()

// Every combination of values renders objects that the lab's Kubernetes
// would take: kubeconform, strict, against its OpenAPI schemas. A
// ServiceMonitor (a CRD, no schema there) is checked by TestChartNames only.
func TestChartKubeconform(t *testing.T) {
	kc := kubeconformBinary(t)
	helmBinary(t)
	schemas := kubeSchemas(t)
	dir := t.TempDir()
	var files []string
	want := 0
	for name, values := range chartCombinations {
		vf := filepath.Join(dir, name+".values.yaml")
		if err := os.WriteFile(vf, []byte(values), 0o644); err != nil {
			t.Fatal(err)
		}
		out, err := helmTemplate(t, "cni-usernet", chart, "--namespace", "kube-system", "-f", vf, "--skip-tests=false")
		if err != nil {
			t.Fatalf("%s: helm template: %v\n%s\nvalues:\n%s", name, err, out, values)
		}
		for k := range objects(t, out) {
			if !strings.HasPrefix(k, "ServiceMonitor/") {
				want++
			}
		}
		f := filepath.Join(dir, name+".yaml")
		if err := os.WriteFile(f, []byte(out), 0o644); err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	args := append([]string{"-strict", "-skip", "ServiceMonitor", "-output", "json", "-verbose",
		"-schema-location", filepath.Join(schemas, "{{ .ResourceKind }}{{ .KindSuffix }}.json")}, files...)
	cmd := exec.Command(kc, args...)
	out, err := cmd.Output()
	var res struct {
		Resources []struct {
			Filename, Kind, Name, Status, Msg string
		}
	}
	if jerr := json.Unmarshal(out, &res); jerr != nil {
		t.Fatalf("kubeconform: %v, output not JSON (%v):\n%s", err, jerr, out)
	}
	valid := 0
	for _, r := range res.Resources {
		switch {
		case r.Status == "statusValid":
			valid++
		case r.Status == "statusSkipped" && r.Kind == "ServiceMonitor":
		default: // statusInvalid, statusError, or skipped for want of a schema
			t.Errorf("%s: %s %s: %s %s", filepath.Base(r.Filename), r.Kind, r.Name, r.Status, r.Msg)
		}
	}
	if valid != want {
		t.Errorf("kubeconform found %d valid objects in %d renders, the chart rendered %d (exit: %v)", valid, len(files), want, err)
	}
	t.Logf("%d objects in %d renders valid against k8s.io/kubernetes@%s", valid, len(files), labKubernetes(t))
}

// The check itself: a field Kubernetes does not have, or a wrong type,
// fails it (so a pass above means something).
func TestChartKubeconformCatches(t *testing.T) {
	kc := kubeconformBinary(t)
	schemas := kubeSchemas(t)
	out, err := helmTemplate(t, "cni-usernet", chart, "--namespace", "kube-system")
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, out)
	}
	for name, bad := range map[string]string{
		"unknown field": strings.Replace(out, "      hostPID: true\n", "      hostPID: true\n      hostPid: true\n", 1),
		"wrong type":    strings.Replace(out, "terminationGracePeriodSeconds: 3600", "terminationGracePeriodSeconds: soon", 1),
		"missing name":  strings.Replace(out, "      - name: agent\n", "      - stdin: false\n", 1),
	} {
		if bad == out {
			t.Fatalf("%s: the render has no such line to break", name)
		}
		f := filepath.Join(t.TempDir(), "bad.yaml")
		if err := os.WriteFile(f, []byte(bad), 0o644); err != nil {
			t.Fatal(err)
		}
		o, err := exec.Command(kc, "-strict", "-schema-location", filepath.Join(schemas, "{{ .ResourceKind }}{{ .KindSuffix }}.json"), f).CombinedOutput()
		if err == nil || !strings.Contains(string(o), "is invalid") {
			t.Errorf("%s: kubeconform did not find it invalid (%v):\n%s", name, err, o)
		}
		t.Logf("%s: %s", name, strings.TrimSpace(string(o)))
	}
}
