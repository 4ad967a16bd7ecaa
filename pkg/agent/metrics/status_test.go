package metrics

import (
	"maps"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/cni-usernet/cni-usernet/pkg/api/control"
	"github.com/cni-usernet/cni-usernet/pkg/api/offload"
	"github.com/cni-usernet/cni-usernet/pkg/api/state"
)

// No two descriptors the collector declares share a name: a counter's
// metric tag that reused another metric's name would fail here.
func TestDescribedNamesUnique(t *testing.T) {
	ch := make(chan *prometheus.Desc)
	go func() {
		New(Options{}).Describe(ch)
		close(ch)
	}()
	fqName := regexp.MustCompile(`fqName: "([^"]+)"`)
	seen := map[string]bool{}
	for d := range ch {
		m := fqName.FindStringSubmatch(d.String())
		if m == nil {
			t.Fatalf("descriptor without a name: %s", d)
		}
		if seen[m[1]] {
			t.Errorf("metric %s is declared twice", m[1])
		}
		seen[m[1]] = true
	}
	if len(seen) < 30 {
		t.Errorf("got %d metrics, want the collector's", len(seen))
	}
}

// Tags that do not fit the families are refused.
func TestSeriesOfRejects(t *testing.T) {
	for name, typ := range map[string]reflect.Type{
		"family without labels": reflect.TypeFor[struct {
			A int64 `metric:"bytes_total" help:"a"`
		}](),
		"unknown family": reflect.TypeFor[struct {
			A int64 `metric:"nothing_total{x=y}" help:"a"`
		}](),
		"wrong labels": reflect.TypeFor[struct {
			A int64 `metric:"bytes_total{direction=ingress,leg=app}" help:"a"`
		}](),
		"gauge in a counter family": reflect.TypeFor[struct {
			A int64 `metric:"errors_total{kind=x}" kind:"gauge" help:"a"`
		}](),
	} {
		if _, err := seriesOf(typ); err == nil {
			t.Errorf("%s: got no error", name)
		}
	}
}

// Every counter of a pod's status with a metric tag is exported as that
// series, with its own value.
func TestStatusSeriesValues(t *testing.T) {
	att := &state.Attachment{Version: state.Version, ContainerID: "c0ffee", IfName: "eth0", PodNS: "ns1", PodName: "web",
		GSO: offload.Decision{Requested: offload.ModeAuto, Mode: offload.ModeHardware}}
	st := &control.Status{}
	// A distinct value per counter, so a series fed by the wrong field shows.
	next := 100.0
	set := func(v reflect.Value, fields []control.CounterField) map[string]float64 {
		want := map[string]float64{}
		for _, f := range fields {
			next++
			switch c := v.FieldByIndex(f.Index); c.Kind() {
			case reflect.Int64:
				c.SetInt(int64(next))
			case reflect.Uint64:
				c.SetUint(uint64(next))
			}
			if f.Metric != "" {
				key := "cni_usernet_pod_" + f.Metric
				// As gathered: labels by name.
				labels := slices.SortedFunc(slices.Values(f.Labels), func(a, b control.Label) int { return strings.Compare(a.Name, b.Name) })
				for _, l := range labels {
					key += " " + l.Name + "=" + l.Value
				}
				want[key] = next
			}
		}
		return want
	}
	want := map[string]float64{}
	for _, c := range []struct {
		v   reflect.Value
		typ reflect.Type
	}{{reflect.ValueOf(&st.Wire).Elem(), reflect.TypeFor[control.LegStatus]()}, {reflect.ValueOf(&st.Relay).Elem(), reflect.TypeFor[control.RelayCounters]()}} {
		fields, err := control.CounterFields(c.typ)
		if err != nil {
			t.Fatal(err)
		}
		maps.Copy(want, set(c.v, fields))
	}
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
				if !slices.Contains(podLabels, l.GetName()) {
					key += " " + l.GetName() + "=" + l.GetValue()
				}
			}
			if m.GetCounter() != nil {
				got[key] = m.GetCounter().GetValue()
			} else {
				got[key] = m.GetGauge().GetValue()
			}
		}
	}
	for key, v := range want {
		if got[key] != v {
			t.Errorf("%s: got %v, want %v", key, got[key], v)
		}
	}
	if want["cni_usernet_pod_tcp_connections"] == 0 || want["cni_usernet_pod_bytes_total direction=ingress leg=app"] == 0 {
		t.Errorf("tags not read: %v", want)
	}
}
