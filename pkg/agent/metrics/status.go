package metrics

import (
	"fmt"
	"reflect"
	"slices"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cni-usernet/cni-usernet/pkg/api/control"
)

// A stack's counters are exported as their struct tags say (see
// control.RelayCountersOf): a counter with a metric of its own gets a
// descriptor made from its tags here; one that is a series of a family
// (bytes_total{leg=app,direction=ingress}) joins the family's descriptor,
// defined with its help text in metrics.go, since a family gathers
// counters of several sources.

// family is a labelled metric that several counters feed.
type family struct {
	desc   *prometheus.Desc
	labels []string // in the order desc declares them
}

var families = map[string]family{
	"bytes_total":           {descBytes, []string{"leg", "direction"}},
	"packets_total":         {descPackets, []string{"leg", "direction"}},
	"dropped_packets_total": {descDropped, []string{"reason"}},
	"errors_total":          {descErrors, []string{"kind"}},
	"syn_cookies_total":     {descSynCookies, []string{"result"}},
	"spoofed_dropped_total": {descSpoofed, []string{"where"}},
}

// series is one series a counter of a pod's status exports.
type series struct {
	index  []int // the counter, for reflect.Value.FieldByIndex
	desc   *prometheus.Desc
	kind   prometheus.ValueType
	labels []string // label values, in the family's order
}

var (
	wireSeries  = mustSeriesOf(reflect.TypeFor[control.LegStatus]())
	relaySeries = mustSeriesOf(reflect.TypeFor[control.RelayCounters]())
)

func mustSeriesOf(t reflect.Type) []series {
	s, err := seriesOf(t)
	if err != nil {
		panic(err)
	}
	return s
}

// seriesOf reads the metric tags of t's counters.
func seriesOf(t reflect.Type) ([]series, error) {
	fields, err := control.CounterFields(t)
	if err != nil {
		return nil, err
	}
	var out []series
	for _, f := range fields {
		if f.Metric == "" {
			continue
		}
		s := series{index: f.Index, kind: prometheus.CounterValue}
		if f.Gauge {
			s.kind = prometheus.GaugeValue
		}
		fam, isFamily := families[f.Metric]
		switch {
		case len(f.Labels) == 0 && isFamily:
			return nil, fmt.Errorf("%s.%s: metric %s is a family: name its labels", t.Name(), f.Name, f.Metric)
		case len(f.Labels) == 0:
			s.desc = podDesc(f.Metric, f.Help)
		case !isFamily:
			return nil, fmt.Errorf("%s.%s: no family %s for labels %v", t.Name(), f.Name, f.Metric, f.Labels)
		default:
			s.desc = fam.desc
			for _, l := range f.Labels {
				s.labels = append(s.labels, l.Value)
			}
			var names []string
			for _, l := range f.Labels {
				names = append(names, l.Name)
			}
			if !slices.Equal(names, fam.labels) || f.Gauge {
				return nil, fmt.Errorf("%s.%s: %s's labels are %v, a counter's", t.Name(), f.Name, f.Metric, fam.labels)
			}
		}
		out = append(out, s)
	}
	return out, nil
}

// seriesDescs are the descriptors of the counters with a metric of their
// own; the families are described with the other descriptors.
func seriesDescs() []*prometheus.Desc {
	var out []*prometheus.Desc
	for _, s := range slices.Concat(wireSeries, relaySeries) {
		if s.labels == nil {
			out = append(out, s.desc)
		}
	}
	return out
}

// emitSeries sends the series of counters, a LegStatus or RelayCounters.
func emitSeries(m func(*prometheus.Desc, prometheus.ValueType, float64, ...string), counters reflect.Value, ss []series) {
	for _, s := range ss {
		f := counters.FieldByIndex(s.index)
		var v float64
		switch f.Kind() {
		case reflect.Int64:
			v = float64(f.Int())
		case reflect.Uint64:
			v = float64(f.Uint())
		default:
			panic(fmt.Sprintf("metrics: %s is not a counter", f.Type()))
		}
		m(s.desc, s.kind, v, s.labels...)
	}
}
