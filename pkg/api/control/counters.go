package control

import (
	"fmt"
	"reflect"
	"strings"
	"sync/atomic"
)

// Snapshot reads a set of live counters (LiveRelayCounters) into its
// plain form (RelayCounters): every field of Snap is loaded, atomically,
// from the field of the same name in live, so a snapshot can be encoded
// or compared while the stack goes on counting. It panics when Snap has a
// field that Live lacks or that is not a counter of the same width:
// TestSnapshot instantiates every pair the stack uses.
func Snapshot[Snap, Live any](live *Live) Snap {
	var snap Snap
	dst, src := reflect.ValueOf(&snap).Elem(), reflect.ValueOf(live).Elem()
	for i := range dst.NumField() {
		name := dst.Type().Field(i).Name
		f := src.FieldByName(name)
		if !f.IsValid() {
			panic(fmt.Sprintf("control.Snapshot: %s has no counter %s", src.Type(), name))
		}
		switch c := f.Addr().Interface().(type) {
		case *atomic.Int64:
			dst.Field(i).SetInt(c.Load())
		case *atomic.Uint64:
			dst.Field(i).SetUint(c.Load())
		default:
			panic(fmt.Sprintf("control.Snapshot: %s.%s is a %s, not an atomic counter", src.Type(), name, f.Type()))
		}
	}
	return snap
}

// CounterField is one counter of a set (RelayCounters, LegStatus) as its
// tags describe it.
type CounterField struct {
	// Index finds the field with reflect.Value.FieldByIndex.
	Index []int
	// Name is the field's Go name, Help its help tag.
	Name, Help string
	// Metric is the exported metric's name after cni_usernet_pod_, without
	// labels; empty: not exported.
	Metric string
	// Labels are the label values of a family's series, in the order the
	// tag gives them.
	Labels []Label
	// Gauge: the metric is a gauge (kind:"gauge"), not a counter.
	Gauge bool
}

// Label is one label of a metric tag: {name=value}.
type Label struct{ Name, Value string }

// CounterFields lists the counters of t, a struct of counters, with the
// fields of embedded structs in place; it fails on a field without help
// or with a malformed metric or kind tag.
func CounterFields(t reflect.Type) ([]CounterField, error) {
	var out []CounterField
	for i := range t.NumField() {
		f := t.Field(i)
		if f.Anonymous && f.Type.Kind() == reflect.Struct {
			inner, err := CounterFields(f.Type)
			if err != nil {
				return nil, err
			}
			for _, c := range inner {
				c.Index = append([]int{i}, c.Index...)
				out = append(out, c)
			}
			continue
		}
		c := CounterField{Index: []int{i}, Name: f.Name, Help: f.Tag.Get("help")}
		if c.Help == "" {
			return nil, fmt.Errorf("counter %s.%s has no help tag", t.Name(), f.Name)
		}
		switch kind := f.Tag.Get("kind"); kind {
		case "", "counter":
		case "gauge":
			c.Gauge = true
		default:
			return nil, fmt.Errorf("counter %s.%s: unknown kind %q", t.Name(), f.Name, kind)
		}
		var err error
		if c.Metric, c.Labels, err = parseMetricTag(f.Tag.Get("metric")); err != nil {
			return nil, fmt.Errorf("counter %s.%s: %w", t.Name(), f.Name, err)
		}
		if c.Gauge && c.Metric == "" {
			return nil, fmt.Errorf("counter %s.%s: a kind without a metric", t.Name(), f.Name)
		}
		out = append(out, c)
	}
	return out, nil
}

// parseMetricTag splits "name{a=x,b=y}" into its name and labels.
func parseMetricTag(tag string) (string, []Label, error) {
	name, rest, hasLabels := strings.Cut(tag, "{")
	if !validMetricName(name) && tag != "" {
		return "", nil, fmt.Errorf("metric tag %q: bad name", tag)
	}
	if !hasLabels {
		return name, nil, nil
	}
	body, ok := strings.CutSuffix(rest, "}")
	if !ok || body == "" {
		return "", nil, fmt.Errorf("metric tag %q: labels are {name=value,...}", tag)
	}
	var labels []Label
	for _, kv := range strings.Split(body, ",") {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || !validMetricName(k) || v == "" {
			return "", nil, fmt.Errorf("metric tag %q: bad label %q", tag, kv)
		}
		labels = append(labels, Label{k, v})
	}
	return name, labels, nil
}

// validMetricName: lower case, digits and underscores, as the exported
// names are.
func validMetricName(s string) bool {
	if s == "" || s[0] == '_' || s[len(s)-1] == '_' {
		return false
	}
	for _, c := range s {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '_' {
			return false
		}
	}
	return true
}
