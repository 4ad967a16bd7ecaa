package metrics

import (
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// The dashboard in manifests/ queries only metrics the agent exports, so a
// renamed metric cannot leave it showing "No data".
func TestDashboardQueriesExist(t *testing.T) {
	b, err := os.ReadFile("../../../manifests/grafana-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash any
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("dashboard is not JSON: %v", err)
	}
	exported := map[string]bool{}
	ch := make(chan *prometheus.Desc)
	go func() {
		New(Options{}).Describe(ch)
		close(ch)
	}()
	fqName := regexp.MustCompile(`fqName: "([^"]+)"`)
	for d := range ch {
		if m := fqName.FindStringSubmatch(d.String()); m != nil {
			exported[m[1]] = true
		}
	}
	var exprs []string
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, x := range v {
				if s, ok := x.(string); ok && (k == "expr" || k == "definition") {
					exprs = append(exprs, s)
				}
				walk(x)
			}
		case []any:
			for _, x := range v {
				walk(x)
			}
		}
	}
	walk(dash)
	if len(exprs) < 10 {
		t.Fatalf("found %d queries in the dashboard, want its panels' (≥ 10)", len(exprs))
	}
	name := regexp.MustCompile(`cni_usernet_[a-z_]+`)
	for _, e := range exprs {
		for _, n := range name.FindAllString(e, -1) {
			base := n
			for _, suffix := range []string{"_bucket", "_count", "_sum"} {
				if b, ok := strings.CutSuffix(n, suffix); ok && exported[b] {
					base = b
				}
			}
			if !exported[base] {
				t.Errorf("dashboard queries %s, which the agent does not export: %s", n, e)
			}
		}
	}
}
