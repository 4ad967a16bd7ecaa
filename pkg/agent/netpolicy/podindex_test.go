package netpolicy

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"testing"

	"github.com/cni-usernet/cni-usernet/pkg/api/policy"
)

// An index kept up to date one change at a time, and service tables kept
// between compilations, compile every local pod as a Compiler made anew
// from the same cluster does: through pods added, relabelled, readdressed,
// finished and deleted, namespaces relabelled, added and deleted, and
// endpoints changed.
func TestIndexesCompileAsASnapshot(t *testing.T) {
	snap, locals := benchCluster(12, 8, 60, 12)
	idx := Indexes{Pods: NewPodIndex(), Services: &ServiceTables{}}
	for _, ns := range snap.Namespaces {
		idx.Pods.Namespace(nil, ns)
	}
	for _, p := range snap.Pods {
		idx.Pods.Pod(nil, p)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	keys := func(m map[string]*Pod) []string {
		var out []string
		for k := range m {
			out = append(out, k)
		}
		return out
	}
	changes := []struct {
		name  string
		apply func()
	}{
		{"relabel a pod", func() {
			k := keys(snap.Pods)[rng.IntN(len(snap.Pods))]
			old := snap.Pods[k]
			p := *old
			p.Metadata.Labels = map[string]string{"app": fmt.Sprint("app", rng.IntN(5)), "tier": []string{"front", "back"}[rng.IntN(2)]}
			snap.Pods[k] = &p
			idx.Pods.Pod(old, &p)
		}},
		{"readdress a pod", func() {
			k := keys(snap.Pods)[rng.IntN(len(snap.Pods))]
			old := snap.Pods[k]
			p := *old
			p.Status.PodIPs = []PodIP{{IP: netip.AddrFrom4([4]byte{10, 99, byte(rng.IntN(250)), byte(rng.IntN(250) + 1)}).String()}}
			snap.Pods[k] = &p
			idx.Pods.Pod(old, &p)
		}},
		{"finish a pod", func() {
			k := keys(snap.Pods)[rng.IntN(len(snap.Pods))]
			old := snap.Pods[k]
			p := *old
			p.Status.Phase = "Succeeded"
			snap.Pods[k] = &p
			idx.Pods.Pod(old, &p)
		}},
		{"delete a pod", func() {
			k := keys(snap.Pods)[rng.IntN(len(snap.Pods))]
			idx.Pods.Pod(snap.Pods[k], nil)
			delete(snap.Pods, k)
		}},
		{"add a pod in a namespace without an object", func() {
			p := testPod("orphan", fmt.Sprint("p", rng.IntN(1000)))
			p.Metadata.Labels = map[string]string{"app": "app1", "tier": "front"}
			k := p.Metadata.Namespace + "/" + p.Metadata.Name
			idx.Pods.Pod(snap.Pods[k], p)
			snap.Pods[k] = p
		}},
		{"add a pod to a namespace", func() {
			p := testPod(fmt.Sprintf("ns%03d", rng.IntN(12)), fmt.Sprint("new", rng.IntN(1000)))
			p.Metadata.Labels = map[string]string{"app": fmt.Sprint("app", rng.IntN(5)), "tier": "front"}
			p.Status.PodIPs = []PodIP{{IP: netip.AddrFrom4([4]byte{10, 98, byte(rng.IntN(250)), byte(rng.IntN(250) + 1)}).String()}}
			k := p.Metadata.Namespace + "/" + p.Metadata.Name
			idx.Pods.Pod(snap.Pods[k], p)
			snap.Pods[k] = p
		}},
		{"relabel a namespace", func() {
			name := fmt.Sprintf("ns%03d", rng.IntN(12))
			old := snap.Namespaces[name]
			n := &Namespace{Metadata: ObjectMeta{Name: name, Labels: map[string]string{"team": fmt.Sprint("t", rng.IntN(10)), "env": "prod"}}}
			snap.Namespaces[name] = n
			idx.Pods.Namespace(old, n)
		}},
		{"delete a namespace object", func() {
			name := fmt.Sprintf("ns%03d", rng.IntN(12))
			if old := snap.Namespaces[name]; old != nil {
				idx.Pods.Namespace(old, nil)
				delete(snap.Namespaces, name)
			}
		}},
		{"change endpoints", func() {
			k := fmt.Sprintf("ns%03d/svc-1", rng.IntN(12))
			es := *snap.EndpointSlices[k]
			es.Endpoints = es.Endpoints[:rng.IntN(len(es.Endpoints)+1)]
			snap.EndpointSlices[k] = &es
		}},
		{"nothing", func() {}},
	}
	for step := range 120 {
		c := changes[rng.IntN(len(changes))]
		c.apply()
		// A round's snapshot: maps of its own, as the agent's cache
		// lists them.
		round := &Snapshot{Policies: snap.Policies, Services: maps.Clone(snap.Services), EndpointSlices: maps.Clone(snap.EndpointSlices)}
		fresh := NewCompiler(snap, locals)
		kept := NewIndexedCompiler(idx, round, locals)
		for _, lp := range locals {
			if lp.Pod = snap.Pods[lp.Pod.Metadata.Namespace+"/"+lp.Pod.Metadata.Name]; lp.Pod == nil {
				continue
			}
			want, _ := fresh.Compile(lp, []netip.Addr{netip.MustParseAddr("192.0.2.1")}, 1)
			got, _ := kept.Compile(lp, []netip.Addr{netip.MustParseAddr("192.0.2.1")}, 1)
			if !policy.Equal(got, want) {
				t.Fatalf("step %d (%s), pod %s: the kept indexes compile\n%s\na snapshot compiles\n%s",
					step, c.name, lp.Pod.Metadata.Name, mustJSON(t, got), mustJSON(t, want))
			}
		}
	}
}

// The service table is taken again for the same objects, and made anew
// when one of them is replaced.
func TestServiceTablesReuse(t *testing.T) {
	snap, _ := benchCluster(3, 4, 0, 0)
	var m ServiceTables
	first := m.get(&Snapshot{Services: maps.Clone(snap.Services), EndpointSlices: maps.Clone(snap.EndpointSlices)})
	if again := m.get(&Snapshot{Services: maps.Clone(snap.Services), EndpointSlices: maps.Clone(snap.EndpointSlices)}); again != first {
		t.Error("the same objects made a new table")
	}
	es := *snap.EndpointSlices["ns001/svc-1"]
	es.Endpoints = es.Endpoints[:1]
	slices := maps.Clone(snap.EndpointSlices)
	slices["ns001/svc-1"] = &es
	changed := m.get(&Snapshot{Services: maps.Clone(snap.Services), EndpointSlices: slices})
	if changed == first || len(changed.byBackend) >= len(first.byBackend) {
		t.Errorf("a replaced EndpointSlice: table reused (%v) or its backends kept (%d, before %d)", changed == first, len(changed.byBackend), len(first.byBackend))
	}
	slices = maps.Clone(slices)
	delete(slices, "ns002/svc-1")
	if gone := m.get(&Snapshot{Services: maps.Clone(snap.Services), EndpointSlices: slices}); gone == changed {
		t.Error("a deleted EndpointSlice: table reused")
	}
}
