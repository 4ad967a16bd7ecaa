package watch

import (
	"context"
	"encoding/json"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	kwatch "k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

// entry is what the reflector carries from source to store: an object
// already transformed (val), keyed. A bookmark's has no val.
type entry[T any] struct {
	key, rv string
	val     *T
}

func (e *entry[T]) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }
func (e *entry[T]) DeepCopyObject() runtime.Object   { c := *e; return &c }

// GetObjectMeta lets the reflector read the resourceVersion (meta.Accessor).
func (e *entry[T]) GetObjectMeta() metav1.Object {
	return &metav1.ObjectMeta{ResourceVersion: e.rv}
}

// entryList is a list page of entries, as the reflector's pager reads it.
type entryList struct {
	metav1.TypeMeta
	metav1.ListMeta
	Items []runtime.Object
}

func (l *entryList) DeepCopyObject() runtime.Object {
	c := *l
	c.Items = append([]runtime.Object(nil), l.Items...)
	return &c
}

// source lists and watches one collection for client-go's reflector and
// transforms each object once, as it arrives: the reflector's pages and
// events hold only what the cache keeps.
type source[T any] struct {
	c  *collection[T]
	rc *rest.RESTClient
	// report is told the outcome of every list and watch request.
	report func(error)
	// absent is told whether an optional collection's resource is
	// served (false) or answered 404 (true); for a 404 it says whether
	// to take it as an empty list.
	absent func(bool) (empty bool)
}

var (
	_ cache.ListerWatcherWithContext = (*source[struct{}])(nil)
	_ cache.ListerWatcher            = (*source[struct{}])(nil)
)

// IsWatchListSemanticsUnSupported turns client-go's streaming list off: a
// server that ignores sendInitialEvents (older ones, the test stand-ins)
// would leave the reflector waiting for a bookmark that never comes. The
// lists are paged instead, as before.
func (s *source[T]) IsWatchListSemanticsUnSupported() bool { return true }

func (s *source[T]) ListWithContext(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
	req := s.rc.Get().Resource(s.c.kind.Resource).VersionedParams(&opts, parameterCodec)
	if s.c.acceptList != "" {
		req.SetHeader("Accept", s.c.acceptList)
	}
	list, err := s.decodeList(req.Do(ctx))
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	if s.c.optional {
		switch {
		case err == nil:
			s.absent(false)
		case s.notServed(ctx, err) && s.absent(true):
			s.report(nil)
			return &entryList{}, nil
		}
	}
	s.report(err)
	if err != nil {
		return nil, fmt.Errorf("listing %s: %w", s.c.kind, err)
	}
	lm, err := meta.ListAccessor(list)
	if err != nil {
		return nil, fmt.Errorf("listing %s: %w", s.c.kind, err)
	}
	out := &entryList{ListMeta: metav1.ListMeta{ResourceVersion: lm.GetResourceVersion(), Continue: lm.GetContinue(), RemainingItemCount: lm.GetRemainingItemCount()}}
	err = meta.EachListItem(list, func(o runtime.Object) error {
		e, err := s.entry(o, true)
		if err != nil {
			return err
		}
		out.Items = append(out.Items, e)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("listing %s: %w", s.c.kind, err)
	}
	return out, nil
}

// decodeList is the list the server sent, of whatever list kind it
// named: a server may answer a metadata-only list with whole objects (a
// NamespaceList), and decoding that into the list type asked for would
// leave it empty without an error (client-go's Into drops an object of
// another kind). An answer that names no kind (taken as the watch
// events' item kind, not a list), or one this scheme does not know, is
// decoded as the type asked for.
func (s *source[T]) decodeList(res rest.Result) (runtime.Object, error) {
	obj, err := res.Get()
	switch {
	case err == nil && meta.IsListType(obj):
		return obj, nil
	case err == nil, runtime.IsMissingKind(err), runtime.IsNotRegisteredError(err):
		list := s.c.newList()
		return list, res.Into(list)
	}
	return nil, err
}

func (s *source[T]) WatchWithContext(ctx context.Context, opts metav1.ListOptions) (kwatch.Interface, error) {
	opts.Watch = true
	req := s.rc.Get().Resource(s.c.kind.Resource).VersionedParams(&opts, parameterCodec)
	if s.c.accept != "" {
		req.SetHeader("Accept", s.c.accept)
	}
	w, err := req.Watch(ctx)
	if ctx.Err() != nil {
		if w != nil {
			w.Stop()
		}
		return nil, ctx.Err()
	}
	// A version the server no longer has is no outage: the reflector
	// lists again. Nor is an optional resource that is not served: the
	// reflector lists again after its backoff, and finds it when it
	// comes.
	if err == nil || !apierrors.IsResourceExpired(err) && !apierrors.IsGone(err) && !s.notServed(ctx, err) {
		s.report(err)
	}
	if err != nil {
		return nil, fmt.Errorf("watching %s: %w", s.c.kind, err)
	}
	return kwatch.Filter(w, func(ev kwatch.Event) (kwatch.Event, bool) {
		switch ev.Type {
		case kwatch.Added, kwatch.Modified, kwatch.Deleted, kwatch.Bookmark:
			e, err := s.entry(ev.Object, ev.Type == kwatch.Added || ev.Type == kwatch.Modified)
			if err != nil {
				// The reflector ends the watch on an error event and
				// lists again.
				return kwatch.Event{Type: kwatch.Error, Object: &apierrors.NewInternalError(err).ErrStatus}, true
			}
			ev.Object = e
		}
		return ev, true
	}), nil
}

// notServed says whether an optional collection's request failed because
// the API server does not serve its resource: a 404, or a 403 for a
// resource its discovery (open to every authenticated client) does not
// list. The server authorizes a request before it looks the resource up,
// so an agent whose ClusterRole lacks the rule (a chart of an earlier
// version, or RBAC managed by hand) gets 403 on a cluster without the
// CRD, where there is no policy to miss. Where the resource is served,
// or discovery cannot say, a 403 stays an outage: the objects may hold
// denials, and the pods wait for them.
func (s *source[T]) notServed(ctx context.Context, err error) bool {
	switch {
	case !s.c.optional || err == nil:
		return false
	case apierrors.IsNotFound(err):
		return true
	case !apierrors.IsForbidden(err):
		return false
	}
	raw, derr := s.rc.Get().AbsPath("/apis", s.c.kind.Group, s.c.kind.Version).SetHeader("Accept", "application/json").Do(ctx).Raw()
	if apierrors.IsNotFound(derr) {
		return true
	}
	var list metav1.APIResourceList
	if derr != nil || json.Unmarshal(raw, &list) != nil {
		return false
	}
	for _, r := range list.APIResources {
		if r.Name == s.c.kind.Resource {
			return false
		}
	}
	return true
}

// entry keys o and, when full, transforms it.
func (s *source[T]) entry(o runtime.Object, full bool) (*entry[T], error) {
	m, err := meta.Accessor(o)
	if err != nil {
		return nil, fmt.Errorf("%s: reading an object's metadata: %w", s.c.kind, err)
	}
	e := &entry[T]{key: m.GetName(), rv: m.GetResourceVersion()}
	if ns := m.GetNamespace(); ns != "" {
		e.key = ns + "/" + e.key
	}
	if full {
		if e.val, err = s.c.transform(o); err != nil {
			return nil, fmt.Errorf("%s %s: %w", s.c.kind, e.key, err)
		}
	}
	return e, nil
}

// List and Watch are the reflector's older interface, which its
// constructor still takes; it calls the WithContext methods.
func (s *source[T]) List(opts metav1.ListOptions) (runtime.Object, error) {
	return s.ListWithContext(context.Background(), opts)
}

func (s *source[T]) Watch(opts metav1.ListOptions) (kwatch.Interface, error) {
	return s.WatchWithContext(context.Background(), opts)
}
