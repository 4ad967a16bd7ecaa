package fakeapi

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strconv"
	"sync"
)

// Kind is a collection the server serves.
type Kind struct {
	Group, Version, Resource, Kind string
	Namespaced                     bool
}

// APIVersion is the kind's apiVersion: "v1", "networking.k8s.io/v1".
func (k Kind) APIVersion() string {
	if k.Group == "" {
		return k.Version
	}
	return k.Group + "/" + k.Version
}

// Path is the collection's path across namespaces: /api/v1/pods.
func (k Kind) Path() string {
	if k.Group == "" {
		return "/api/" + k.Version + "/" + k.Resource
	}
	return "/apis/" + k.Group + "/" + k.Version + "/" + k.Resource
}

// Kinds are the collections served unless Options.Kinds says otherwise:
// those the agent and the plugin read.
var Kinds = []Kind{
	{"", "v1", "pods", "Pod", true},
	{"", "v1", "namespaces", "Namespace", false},
	{"", "v1", "services", "Service", true},
	{"", "v1", "nodes", "Node", false},
	{"discovery.k8s.io", "v1", "endpointslices", "EndpointSlice", true},
	{"networking.k8s.io", "v1", "networkpolicies", "NetworkPolicy", true},
	{"apps", "v1", "daemonsets", "DaemonSet", true},
}

// Versioned is an object the store can give its resourceVersion before
// encoding it, once; any other object is encoded, then given it.
type Versioned interface{ SetResourceVersion(string) }

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

// Store is the server's cluster: the objects of every collection, one
// resourceVersion counter across them as etcd's, and the log of every
// change since the last compaction, from which a watch resumes at any
// resourceVersion it was given (older ones are 410 Gone).
type Store struct {
	mu      sync.Mutex // guards the fields below
	rv      uint64
	first   uint64 // the resourceVersion the log starts after
	objs    map[string]map[string]*stored
	sorted  map[string][]string // keys in order, per resource; nil: stale
	log     []logEntry
	changed chan struct{} // closed and made anew at each change
}

func newStore(kinds []Kind) *Store {
	s := &Store{objs: map[string]map[string]*stored{}, sorted: map[string][]string{}, changed: make(chan struct{})}
	for _, k := range kinds {
		s.objs[k.Resource] = map[string]*stored{}
	}
	return s
}

// Load writes objects without logging them, and compacts the log: the
// cluster as it was before any client looked. A watch starts from a list.
func (s *Store) Load(resource string, objs ...any) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, o := range objs {
		if _, err := s.writeLocked(resource, "", o); err != nil {
			return err
		}
	}
	s.first = s.rv
	s.log = nil
	return nil
}

// Put writes obj (a typed object, or its JSON as []byte or
// json.RawMessage), ADDED or MODIFIED, wakes the watches and returns the
// resourceVersion it was given.
func (s *Store) Put(resource string, obj any) (uint64, error) {
	return s.apply(resource, "", obj)
}

// Delete removes ns/name (ns empty for a cluster-wide kind) and sends
// DELETED to the watches.
func (s *Store) Delete(resource, ns, name string) error {
	s.mu.Lock()
	o := s.objs[resource][ns+"/"+name]
	s.mu.Unlock()
	if o == nil {
		return fmt.Errorf("deleting %s %s/%s: not there", resource, ns, name)
	}
	_, err := s.apply(resource, "DELETED", o.raw)
	return err
}

// Compact forgets the log, as etcd's compaction: a watch from an older
// resourceVersion is 410 Gone, and a client learns what changed only by
// listing again.
func (s *Store) Compact() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.first = s.rv
	s.log = nil
}

func (s *Store) apply(resource, typ string, obj any) (uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st, err := s.writeLocked(resource, typ, obj)
	if err != nil {
		return 0, err
	}
	s.wakeLocked()
	return st.rv, nil
}

func (s *Store) wakeLocked() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// wake ends the watches' wait, for them to look at the faults again.
func (s *Store) wake() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.wakeLocked()
}

// header is what the store reads of an object.
type header struct {
	Metadata struct {
		Name      string            `json:"name"`
		Namespace string            `json:"namespace"`
		Labels    map[string]string `json:"labels"`
	} `json:"metadata"`
	Spec struct {
		NodeName string `json:"nodeName"`
	} `json:"spec"`
}

// encode is obj's JSON with resourceVersion rv.
func encode(obj any, rv string) ([]byte, error) {
	switch o := obj.(type) {
	case []byte:
		return withRV(o, rv)
	case json.RawMessage:
		return withRV(o, rv)
	case Versioned:
		o.SetResourceVersion(rv)
		return json.Marshal(o)
	}
	b, err := json.Marshal(obj)
	if err != nil {
		return nil, err
	}
	return withRV(b, rv)
}

func withRV(b []byte, rv string) ([]byte, error) {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(b, &top); err != nil {
		return nil, err
	}
	md := map[string]json.RawMessage{}
	if m, ok := top["metadata"]; ok {
		if err := json.Unmarshal(m, &md); err != nil {
			return nil, fmt.Errorf("reading metadata: %w", err)
		}
	}
	md["resourceVersion"], _ = json.Marshal(rv)
	top["metadata"], _ = json.Marshal(md)
	// A list item carries neither; the server adds them where the API
	// server does.
	delete(top, "kind")
	delete(top, "apiVersion")
	return json.Marshal(top)
}

// writeLocked writes one object; typ "" is ADDED or MODIFIED, whichever
// it is, and nothing is logged for a Load.
func (s *Store) writeLocked(resource, typ string, o any) (*stored, error) {
	coll, ok := s.objs[resource]
	if !ok {
		return nil, fmt.Errorf("no collection %q", resource)
	}
	s.rv++
	raw, err := encode(o, strconv.FormatUint(s.rv, 10))
	if err != nil {
		return nil, fmt.Errorf("encoding a %s: %w", resource, err)
	}
	var h header
	if err := json.Unmarshal(raw, &h); err != nil {
		return nil, fmt.Errorf("reading a %s: %w", resource, err)
	}
	st := &stored{ns: h.Metadata.Namespace, name: h.Metadata.Name, labels: maps.Clone(h.Metadata.Labels),
		nodeName: h.Spec.NodeName, rv: s.rv, raw: raw}
	if st.name == "" {
		return nil, fmt.Errorf("a %s without a name", resource)
	}
	_, had := coll[st.key()]
	logged := typ
	switch typ {
	case "", "ADDED", "MODIFIED":
		coll[st.key()] = st
		if !had {
			s.sorted[resource] = nil
			logged = "ADDED"
		} else {
			logged = "MODIFIED"
		}
	case "DELETED":
		delete(coll, st.key())
		s.sorted[resource] = nil
	default:
		return nil, fmt.Errorf("change of unknown type %q", typ)
	}
	s.log = append(s.log, logEntry{logged, resource, st})
	return st, nil
}

// page is the objects of resource that match sel, in key order, from the
// first key after `after`, at most limit of them (0: all); more says
// whether others follow.
func (s *Store) page(resource string, sel selector, after string, limit int) (objs []*stored, rv uint64, more bool) {
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
func (s *Store) get(resource, ns, name string) *stored {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.objs[resource][ns+"/"+name]
}

// Get is the JSON of ns/name as a list holds it (without kind), or nil.
func (s *Store) Get(resource, ns, name string) []byte {
	if o := s.get(resource, ns, name); o != nil {
		return o.raw
	}
	return nil
}

// Len is how many objects resource holds.
func (s *Store) Len(resource string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.objs[resource])
}

// since returns the log's entries after resourceVersion rv and the
// channel closed at the next change; gone when rv is older than the log.
func (s *Store) since(rv uint64) (entries []logEntry, changed <-chan struct{}, gone bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if rv < s.first {
		return nil, s.changed, true
	}
	i := sort.Search(len(s.log), func(k int) bool { return s.log[k].obj.rv > rv })
	return slices.Clone(s.log[i:]), s.changed, false
}

// Current is the store's resourceVersion.
func (s *Store) Current() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.rv
}
