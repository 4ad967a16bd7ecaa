package watch

import (
	"fmt"

	"k8s.io/client-go/tools/cache"

	"github.com/cni-usernet/cni-usernet/pkg/agent/netpolicy"
)

// store is the Informer as the reflector writes to it: each call applies
// one list or event to the typed map, then tells OnChange.
type store[T any] Informer[T]

var _ cache.ReflectorStore = (*store[struct{}])(nil)

// change is one object's change, told after the lock is released.
type change[T any] struct{ old, new *T }

func (s *store[T]) Add(obj any) error    { return s.put(obj) }
func (s *store[T]) Update(obj any) error { return s.put(obj) }

func (s *store[T]) put(obj any) error {
	e, err := s.entryOf(obj)
	if err != nil || e.val == nil {
		return err
	}
	s.mu.Lock()
	old := s.items[e.key]
	s.items[e.key] = e.val
	s.mu.Unlock()
	s.tell(change[T]{old, e.val})
	return nil
}

func (s *store[T]) Delete(obj any) error {
	e, err := s.entryOf(obj)
	if err != nil {
		return err
	}
	s.mu.Lock()
	old, ok := s.items[e.key]
	delete(s.items, e.key)
	s.mu.Unlock()
	if ok {
		s.tell(change[T]{old, nil})
	}
	return nil
}

// Replace installs a complete list: OnChange hears of what it added,
// changed (another resourceVersion) and removed.
func (s *store[T]) Replace(list []any, _ string) error {
	items := make(map[string]*T, len(list))
	rvs := make(map[string]string, len(list))
	for _, obj := range list {
		e, err := s.entryOf(obj)
		if err != nil {
			return err
		}
		if e.val != nil {
			items[e.key], rvs[e.key] = e.val, e.rv
		}
	}
	s.mu.Lock()
	prev := s.items
	var changes []change[T]
	for k, v := range items {
		old := prev[k]
		if old != nil && resourceVersion(old) == rvs[k] && rvs[k] != "" {
			// Unchanged: keep the object callers may already hold.
			items[k] = old
			continue
		}
		changes = append(changes, change[T]{old, v})
	}
	for k, old := range prev {
		if _, ok := items[k]; !ok {
			changes = append(changes, change[T]{old, nil})
		}
	}
	s.items = items
	s.mu.Unlock()
	// Synced only once OnChange has heard of the whole list: a caller
	// that keeps its own index from the changes (the policy controller's
	// peers) must not compile against half of the first list.
	for _, c := range changes {
		s.tell(c)
	}
	s.mu.Lock()
	first := !s.synced
	s.synced = true
	s.mu.Unlock()
	if first {
		close(s.syncedCh)
	}
	return nil
}

// Resync has nothing to do: there is no queue to feed again.
func (s *store[T]) Resync() error { return nil }

func (s *store[T]) entryOf(obj any) (*entry[T], error) {
	e, ok := obj.(*entry[T])
	if !ok {
		return nil, fmt.Errorf("watching %s: the reflector passed a %T", s.o.Kind, obj)
	}
	return e, nil
}

func (s *store[T]) tell(c change[T]) {
	if s.o.OnChange != nil {
		s.o.OnChange(c.old, c.new)
	}
}

// resourceVersion is the version of a cached object, "" for a type
// without one (then a list tells every object as changed).
func resourceVersion(v any) string {
	switch o := v.(type) {
	case *netpolicy.Pod:
		return o.Metadata.ResourceVersion
	case *netpolicy.Namespace:
		return o.Metadata.ResourceVersion
	case *netpolicy.Service:
		return o.Metadata.ResourceVersion
	case *netpolicy.EndpointSlice:
		return o.Metadata.ResourceVersion
	case *netpolicy.NetworkPolicy:
		return o.Metadata.ResourceVersion
	case *netpolicy.ClusterNetworkPolicy:
		return o.Metadata.ResourceVersion
	}
	return ""
}
