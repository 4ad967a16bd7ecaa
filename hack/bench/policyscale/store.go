package main

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strconv"
	"sync"
)

// kindInfo is a collection the fake API server serves.
type kindInfo struct {
	group, version, resource, kind string
	namespaced                     bool
}

func (k kindInfo) apiVersion() string {
	if k.group == "" {
		return k.version
	}
	return k.group + "/" + k.version
}

// kinds are the collections served, by resource name.
var kinds = map[string]kindInfo{
	"pods":            {"", "v1", "pods", "Pod", true},
	"namespaces":      {"", "v1", "namespaces", "Namespace", false},
	"services":        {"", "v1", "services", "Service", true},
	"nodes":           {"", "v1", "nodes", "Node", false},
	"endpointslices":  {"discovery.k8s.io", "v1", "endpointslices", "EndpointSlice", true},
	"networkpolicies": {"networking.k8s.io", "v1", "networkpolicies", "NetworkPolicy", true},
}

// stored is one object as the store keeps it: encoded once, when written,
// so that a list of 100,000 pods is copied, not marshalled, and with what
// the selectors compare.
type stored struct {
	ns, name string
	labels   map[string]string
	nodeName string
	rv       uint64
	raw      []byte // JSON, without kind and apiVersion (a list item's form)
}

func (o *stored) key() string { return o.ns + "/" + o.name }

// logEntry is one change the watches send.
type logEntry struct {
	typ      string // ADDED, MODIFIED, DELETED
	resource string
	obj      *stored
}

// store is the fake API server's cluster: the objects of every
// collection, one resourceVersion counter across them as etcd's, and the
// log of every change since the initial load, from which a watch resumes
// at any resourceVersion it was given (so none is ever too old, 410,
// unless it predates the load).
type store struct {
	mu      sync.Mutex // guards the fields below
	rv      uint64
	first   uint64 // the resourceVersion the log starts after
	objs    map[string]map[string]*stored
	sorted  map[string][]string // keys in order, per resource; nil: stale
	log     []logEntry
	changed chan struct{} // closed and made anew at each change
}

func newStore() *store {
	s := &store{objs: map[string]map[string]*stored{}, sorted: map[string][]string{}, changed: make(chan struct{})}
	for r := range kinds {
		s.objs[r] = map[string]*stored{}
	}
	return s
}

// load writes the initial objects, without logging them: watches start
// from a list of them.
func (s *store) load(resource string, objs ...object) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, o := range objs {
		if _, err := s.writeLocked(resource, "ADDED", o); err != nil {
			return err
		}
	}
	s.first = s.rv
	s.log = nil
	return nil
}

// apply writes one change and wakes the watches.
func (s *store) apply(c change) (uint64, error) {
	s.mu.Lock()
	st, err := s.writeLocked(c.resource, c.typ, c.obj)
	if err != nil {
		s.mu.Unlock()
		return 0, err
	}
	s.log = append(s.log, logEntry{c.typ, c.resource, st})
	close(s.changed)
	s.changed = make(chan struct{})
	s.mu.Unlock()
	return st.rv, nil
}

func (s *store) writeLocked(resource, typ string, o object) (*stored, error) {
	coll, ok := s.objs[resource]
	if !ok {
		return nil, fmt.Errorf("no collection %q", resource)
	}
	s.rv++
	m := o.meta()
	m.ResourceVersion = strconv.FormatUint(s.rv, 10)
	raw, err := json.Marshal(o)
	if err != nil {
		return nil, fmt.Errorf("encoding %s %s/%s: %w", resource, m.Namespace, m.Name, err)
	}
	st := &stored{ns: m.Namespace, name: m.Name, labels: maps.Clone(m.Labels), nodeName: nodeNameOf(o), rv: s.rv, raw: raw}
	_, had := coll[st.key()]
	switch typ {
	case "ADDED", "MODIFIED":
		coll[st.key()] = st
		if !had {
			s.sorted[resource] = nil
		}
	case "DELETED":
		delete(coll, st.key())
		s.sorted[resource] = nil
	default:
		return nil, fmt.Errorf("change of unknown type %q", typ)
	}
	return st, nil
}

// page is the objects of resource that match sel, in key order, from the
// first key after `after`, at most limit of them (0: all); more says
// whether others follow.
func (s *store) page(resource string, sel selector, after string, limit int) (objs []*stored, rv uint64, more bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	keys := s.sorted[resource]
	if keys == nil {
		for k := range s.objs[resource] {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		s.sorted[resource] = keys
	}
	i := 0
	if after != "" {
		i, _ = slices.BinarySearch(keys, after)
		if i < len(keys) && keys[i] == after {
			i++
		}
	}
	for ; i < len(keys); i++ {
		o := s.objs[resource][keys[i]]
		if !sel.matches(o) {
			continue
		}
		if limit > 0 && len(objs) == limit {
			return objs, s.rv, true
		}
		objs = append(objs, o)
	}
	return objs, s.rv, false
}

// get is one object; nil if there is none.
func (s *store) get(resource, ns, name string) *stored {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.objs[resource][ns+"/"+name]
}

// since returns the log's entries after resourceVersion rv from index
// hint on (the index to pass next time), and the channel closed at the
// next change; gone when rv is older than the log.
func (s *store) since(rv uint64, hint int) (entries []logEntry, next int, changed <-chan struct{}, gone bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if rv < s.first {
		return nil, 0, nil, true
	}
	i := hint
	if i == 0 {
		i = sort.Search(len(s.log), func(k int) bool { return s.log[k].obj.rv > rv })
	}
	return slices.Clone(s.log[i:]), len(s.log), s.changed, false
}

// current is the store's resourceVersion.
func (s *store) current() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.rv
}
