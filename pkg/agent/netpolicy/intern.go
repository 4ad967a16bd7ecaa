package netpolicy

import (
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unique"
	"weak"
)

// Interning the labels and the short strings of cached objects: the
// agent holds every pod of the cluster, and at 100k pods their labels
// were a quarter of its live heap, although the pods of one ReplicaSet
// (most pods) carry the same labels: one map each.

// labelSet is one interned set of labels. An object whose labels were
// interned holds it (ObjectMeta.labelSet) for as long as it holds the
// map: the table below keeps only a weak pointer, so that a set no object
// holds any more is collected and its entry removed.
type labelSet struct {
	labels map[string]string
}

var labelSets = struct {
	mu    sync.Mutex
	byKey map[string]weak.Pointer[labelSet]
}{byKey: map[string]weak.Pointer[labelSet]{}}

// InternLabels makes m's labels the interned map with the same labels:
// the callers treat Labels as read-only, and every object with these
// labels then shares one map. Its keys and values are interned strings.
func (m *ObjectMeta) InternLabels() {
	if len(m.Labels) == 0 {
		m.Labels, m.labelSet = nil, nil
		return
	}
	m.labelSet = internLabels(m.Labels)
	m.Labels = m.labelSet.labels
}

func internLabels(labels map[string]string) *labelSet {
	key := labelsKey(labels)
	labelSets.mu.Lock()
	defer labelSets.mu.Unlock()
	if s := labelSets.byKey[key].Value(); s != nil {
		return s
	}
	s := &labelSet{labels: make(map[string]string, len(labels))}
	for k, v := range labels {
		s.labels[Intern(k)] = Intern(v)
	}
	wp := weak.Make(s)
	labelSets.byKey[key] = wp
	runtime.AddCleanup(s, func(key string) {
		labelSets.mu.Lock()
		// A set made anew for the same labels may have taken the entry.
		if labelSets.byKey[key] == wp {
			delete(labelSets.byKey, key)
		}
		labelSets.mu.Unlock()
	}, key)
	return s
}

// labelsKey is labels in one form: sorted, each key and value preceded
// by its length, so that no two sets share a key.
func labelsKey(labels map[string]string) string {
	keys := make([]string, 0, len(labels))
	n := 0
	for k, v := range labels {
		keys = append(keys, k)
		n += len(k) + len(v) + 8
	}
	slices.Sort(keys)
	var b strings.Builder
	b.Grow(n)
	for _, k := range keys {
		for _, s := range []string{k, labels[k]} {
			b.WriteString(strconv.Itoa(len(s)))
			b.WriteByte(':')
			b.WriteString(s)
		}
	}
	return b.String()
}

// interned says whether the table has an entry for labels, for tests.
func interned(labels map[string]string) bool {
	labelSets.mu.Lock()
	defer labelSets.mu.Unlock()
	_, ok := labelSets.byKey[labelsKey(labels)]
	return ok
}

// Intern returns s's canonical copy: strings that many cached objects
// repeat (namespaces, node names, label keys and values, protocols) are
// then held once. The runtime's unique table collects a string no one
// holds any more.
func Intern(s string) string {
	if s == "" {
		return ""
	}
	return unique.Make(s).Value()
}
