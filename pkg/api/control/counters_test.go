package control_test

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/cni-usernet/cni-usernet/pkg/api/control"
)

// Every counter says what it counts, its metric tag parses, and no two
// counters of a pod's status feed the same series.
func TestCounterTags(t *testing.T) {
	series := map[string]string{}
	for _, typ := range []reflect.Type{reflect.TypeFor[control.RelayCounters](), reflect.TypeFor[control.LegStatus]()} {
		fields, err := control.CounterFields(typ)
		if err != nil {
			t.Fatal(err)
		}
		if len(fields) < 10 {
			t.Fatalf("%s: got %d counters, want its fields", typ, len(fields))
		}
		for _, f := range fields {
			if f.Metric == "" {
				continue
			}
			key := f.Metric
			for _, l := range f.Labels {
				key += "," + l.Name + "=" + l.Value
			}
			if other, dup := series[key]; dup {
				t.Errorf("%s.%s and %s both export %s", typ.Name(), f.Name, other, key)
			}
			series[key] = typ.Name() + "." + f.Name
		}
	}
}

func TestCounterFieldsRejects(t *testing.T) {
	for name, typ := range map[string]reflect.Type{
		"no help": reflect.TypeFor[struct {
			A int64 `metric:"a_total"`
		}](),
		"bad name": reflect.TypeFor[struct {
			A int64 `metric:"A-total" help:"a"`
		}](),
		"bad labels": reflect.TypeFor[struct {
			A int64 `metric:"a_total{x}" help:"a"`
		}](),
		"bad kind": reflect.TypeFor[struct {
			A int64 `metric:"a" kind:"histogram" help:"a"`
		}](),
	} {
		if _, err := control.CounterFields(typ); err == nil {
			t.Errorf("%s: got no error", name)
		}
	}
	fs, err := control.CounterFields(reflect.TypeFor[struct {
		A int64 `metric:"a_total{x=1,y=2}" help:"a"`
	}]())
	if err != nil || fs[0].Metric != "a_total" || !reflect.DeepEqual(fs[0].Labels, []control.Label{{"x", "1"}, {"y", "2"}}) {
		t.Errorf("labels: got %+v, %v", fs, err)
	}
}

// Snapshot copies every live counter into the field of the same name, and
// the snapshot encodes as plain numbers.
func TestSnapshot(t *testing.T) {
	var live control.LiveRelayCounters
	v := reflect.ValueOf(&live).Elem()
	for i := range v.NumField() {
		v.Field(i).Addr().Interface().(*atomic.Int64).Store(int64(i + 1))
	}
	snap := control.Snapshot[control.RelayCounters](&live)
	s := reflect.ValueOf(snap)
	for i := range s.NumField() {
		if got := s.Field(i).Int(); got != int64(i+1) {
			t.Errorf("%s: got %d, want %d", s.Type().Field(i).Name, got, i+1)
		}
	}
	b, err := json.Marshal(snap)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"tcpActive":1,`) || !strings.Contains(string(b), fmt.Sprintf(`"fromAppBytes":%d}`, s.NumField())) {
		t.Errorf("encoded: got %s", b)
	}
	var back control.RelayCounters
	if err := json.Unmarshal(b, &back); err != nil || back != snap {
		t.Errorf("decoded: got %+v, %v; want %+v", back, err, snap)
	}
}

// A live set read while it counts: the race detector sees no race.
func TestSnapshotConcurrent(t *testing.T) {
	var live control.LiveRelayCounters
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 1000 {
			live.TCPActive.Add(1)
			live.FromAppBytes.Add(10)
		}
	}()
	for range 100 {
		_ = control.Snapshot[control.RelayCounters](&live)
	}
	<-done
	if s := control.Snapshot[control.RelayCounters](&live); s.TCPActive != 1000 || s.FromAppBytes != 10000 {
		t.Errorf("got %d, %d; want 1000, 10000", s.TCPActive, s.FromAppBytes)
	}
}
