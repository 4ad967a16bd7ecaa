package netpolicy

import (
	"cmp"
	"maps"
	"slices"
	"strings"
	"sync"
)

// PodIndex is the cluster's pods as peers, by namespace, and the
// namespaces' labels, kept up to date one change at a time, so that a
// compilation does not index every pod of the cluster again: at 100k
// pods that was most of a round's CPU and of the memory it held.
//
// Changes only update the maps of their namespace and mark it; a
// compilation takes a view (view), which sorts the marked namespaces'
// pods again and shares the others' sorted lists, read-only, with the
// views before it. It is safe for concurrent use.
type PodIndex struct {
	mu sync.Mutex
	// pods are the peers of each namespace, by key; sorted their sorted
	// lists, absent for a namespace changed since the last view.
	pods   map[string]map[string]*peerPod
	sorted map[string][]*peerPod
	// labels are the namespaces' labels from their objects (with the
	// API server's name label where the object lacks it); known are the
	// names of every namespace with labels or pods, sorted, nil when one
	// came or went since the last view.
	labels map[string]map[string]string
	known  []string
}

// NewPodIndex returns an empty index.
func NewPodIndex() *PodIndex {
	return &PodIndex{
		pods:   map[string]map[string]*peerPod{},
		sorted: map[string][]*peerPod{},
		labels: map[string]map[string]string{},
	}
}

// indexOf indexes snap's pods and namespaces.
func indexOf(snap *Snapshot) *PodIndex {
	x := NewPodIndex()
	for key, ns := range snap.Namespaces {
		if ns != nil {
			x.setNamespace(cmp.Or(ns.Metadata.Name, key), ns.Metadata.Labels)
		}
	}
	for key, pod := range snap.Pods {
		if pod != nil {
			x.setPod(objectKey(pod.Metadata, key), pod)
		}
	}
	return x
}

// Pod applies a pod's change (old nil: added; new nil: deleted).
func (x *PodIndex) Pod(old, new *Pod) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if old != nil {
		x.deletePod(objectKey(old.Metadata, ""), old.Metadata.Namespace)
	}
	if new != nil {
		x.setPod(objectKey(new.Metadata, ""), new)
	}
}

// Namespace applies a namespace's change.
func (x *PodIndex) Namespace(old, new *Namespace) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if old != nil {
		delete(x.labels, old.Metadata.Name)
		x.known = nil
	}
	if new != nil {
		x.setNamespace(new.Metadata.Name, new.Metadata.Labels)
	}
}

func (x *PodIndex) setNamespace(name string, labels map[string]string) {
	if _, ok := x.labels[name]; !ok {
		x.known = nil
	}
	x.labels[name] = namespaceLabels(name, labels)
}

func (x *PodIndex) deletePod(key, ns string) {
	if _, ok := x.pods[ns][key]; !ok {
		return
	}
	delete(x.pods[ns], key)
	delete(x.sorted, ns)
	if len(x.pods[ns]) == 0 {
		delete(x.pods, ns)
		x.known = nil
	}
}

func (x *PodIndex) setPod(key string, pod *Pod) {
	ns := pod.Metadata.Namespace
	x.deletePod(key, ns)
	p := newPeerPod(key, pod, nil)
	if p == nil {
		return
	}
	if x.pods[ns] == nil {
		x.pods[ns] = map[string]*peerPod{}
		x.known = nil
	}
	x.pods[ns][key] = p
	delete(x.sorted, ns)
}

// podView is the pods and namespaces as one compilation sees them.
type podView struct {
	// nsLabels are the labels of every namespace with labels or pods;
	// nsNames their names, sorted.
	nsLabels map[string]map[string]string
	nsNames  []string
	// byNs are the peers of each namespace, sorted by key. Shared
	// between views: never changed, only replaced.
	byNs map[string][]*peerPod
}

func (x *PodIndex) view() *podView {
	x.mu.Lock()
	defer x.mu.Unlock()
	for ns, pods := range x.pods {
		if _, ok := x.sorted[ns]; ok {
			continue
		}
		list := slices.Collect(maps.Values(pods))
		slices.SortFunc(list, func(a, b *peerPod) int { return strings.Compare(a.key, b.key) })
		x.sorted[ns] = list
	}
	if x.known == nil {
		names := map[string]bool{}
		for ns := range x.labels {
			names[ns] = true
		}
		for ns := range x.pods {
			names[ns] = true
		}
		x.known = slices.Sorted(maps.Keys(names))
	}
	v := &podView{nsLabels: make(map[string]map[string]string, len(x.known)), nsNames: x.known, byNs: maps.Clone(x.sorted)}
	for _, ns := range x.known {
		l, ok := x.labels[ns]
		if !ok {
			// A namespace known only from its pods: the name label.
			l = namespaceLabels(ns, nil)
		}
		v.nsLabels[ns] = l
	}
	return v
}

// withLocal is v with the local pods' addresses from their attachments
// added (a pod the API shows no address for yet, during its ADD, is
// already a peer): the namespaces it changes get lists of their own.
func (v *podView) withLocal(local []LocalPod) *podView {
	out := *v
	copied := false
	for _, lp := range local {
		if lp.Pod == nil || len(lp.IPs) == 0 {
			continue
		}
		key, ns := objectKey(lp.Pod.Metadata, ""), lp.Pod.Metadata.Namespace
		p := newPeerPod(key, lp.Pod, lp.IPs)
		if p == nil {
			continue
		}
		list := out.byNs[ns]
		i, found := slices.BinarySearchFunc(list, key, func(q *peerPod, k string) int { return strings.Compare(q.key, k) })
		if found && slices.Equal(list[i].addrs, p.addrs) {
			continue // the API has its addresses already
		}
		if !copied {
			out.byNs, out.nsLabels = maps.Clone(v.byNs), maps.Clone(v.nsLabels)
			copied = true
		}
		list = slices.Clone(list)
		if found {
			list[i] = p
		} else {
			list = slices.Insert(list, i, p)
		}
		out.byNs[ns] = list
		if _, ok := out.nsLabels[ns]; !ok {
			out.nsLabels[ns] = namespaceLabels(ns, nil)
			out.nsNames = slices.Clone(out.nsNames)
			j, _ := slices.BinarySearch(out.nsNames, ns)
			out.nsNames = slices.Insert(out.nsNames, j, ns)
		}
	}
	return &out
}

// eachPod calls f on every peer, by namespace.
func (v *podView) eachPod(f func(*peerPod)) {
	for _, ns := range v.nsNames {
		for _, p := range v.byNs[ns] {
			f(p)
		}
	}
}
