package netpolicy

import (
	"reflect"
	"runtime"
	"testing"
	"time"
)

// Objects with the same labels share one map; other labels, or the same
// text split otherwise between keys and values, get their own; a set no
// object holds any more leaves the table.
func TestInternLabels(t *testing.T) {
	mk := func(l map[string]string) *ObjectMeta {
		m := &ObjectMeta{Labels: l}
		m.InternLabels()
		return m
	}
	a := mk(map[string]string{"app": "web", "tier": "frontend"})
	b := mk(map[string]string{"tier": "frontend", "app": "web"})
	c := mk(map[string]string{"app": "webtier", "": "frontend"})
	d := mk(map[string]string{"app": "web"})
	if reflect.ValueOf(a.Labels).UnsafePointer() != reflect.ValueOf(b.Labels).UnsafePointer() {
		t.Error("two objects with the same labels hold two maps")
	}
	for _, o := range []*ObjectMeta{c, d} {
		if reflect.ValueOf(a.Labels).UnsafePointer() == reflect.ValueOf(o.Labels).UnsafePointer() {
			t.Errorf("labels %v share the map of %v", o.Labels, a.Labels)
		}
	}
	if !reflect.DeepEqual(b.Labels, map[string]string{"app": "web", "tier": "frontend"}) || len(c.Labels) != 2 {
		t.Errorf("interned labels changed: %v, %v", b.Labels, c.Labels)
	}
	if e := mk(map[string]string{}); e.Labels != nil {
		t.Errorf("no labels interned as %v", e.Labels)
	}
	sets := []map[string]string{{"app": "web", "tier": "frontend"}, {"app": "webtier", "": "frontend"}, {"app": "web"}}
	for _, l := range sets {
		if !interned(l) {
			t.Errorf("%v not interned", l)
		}
	}
	runtime.KeepAlive([]*ObjectMeta{a, b, c, d})
	a, b, c, d = nil, nil, nil, nil
	for _, l := range sets {
		for deadline := time.Now().Add(5 * time.Second); interned(l); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%v, held by no object, is still interned", l)
			}
			runtime.GC()
		}
	}
}
