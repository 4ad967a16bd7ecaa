package fakeapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"
)

// watch streams the collection's changes as watch events from the
// resourceVersion asked for: after it (a number), or the whole
// collection as ADDED first ("" or "0", or sendInitialEvents, then ended
// by a BOOKMARK marked k8s.io/initial-events-end).
func (s *Server) watch(w http.ResponseWriter, req *http.Request, r route, k Kind) {
	s.count(s.counts, "watch "+k.Resource)
	sel, err := selectorOf(req, r)
	if err != nil {
		if s.o.Log != nil {
			s.o.Log.Error("fake API server: a watch asks what it cannot answer", "err", err, "query", req.URL.RawQuery)
		}
		writeStatus(w, http.StatusBadRequest, "BadRequest", err.Error())
		return
	}
	s.mu.Lock()
	gen := s.watchGen
	s.mu.Unlock()
	q := req.URL.Query()
	bookmarks := q.Get("allowWatchBookmarks") == "true"
	initial := q.Get("sendInitialEvents") == "true"
	timeout := 30 * time.Minute
	if n, err := strconv.Atoi(q.Get("timeoutSeconds")); err == nil && n > 0 {
		timeout = time.Duration(n) * time.Second
	}
	ctx, cancel := context.WithTimeout(req.Context(), timeout)
	defer cancel()
	flusher, _ := w.(http.Flusher)
	ew := &eventWriter{w: w, k: k, s: s, codec: s.codec(req)}
	if ew.codec != nil {
		w.Header().Set("Content-Type", ew.codec.ContentType+";stream=watch")
	} else {
		w.Header().Set("Content-Type", "application/json")
	}
	w.WriteHeader(http.StatusOK)

	var from uint64
	rvParam := q.Get("resourceVersion")
	if initial || rvParam == "" || rvParam == "0" {
		objs, rv, _ := s.Store.page(k.Resource, sel, "", 0)
		for _, o := range objs {
			ew.event("ADDED", o.raw)
		}
		from = rv
		if initial {
			ew.bookmark(rv, true)
		}
	} else if from, err = strconv.ParseUint(rvParam, 10, 64); err != nil {
		ew.status(http.StatusBadRequest, "BadRequest", "malformed resourceVersion "+rvParam)
		return
	}
	flush(flusher)
	tick := time.NewTicker(s.o.Bookmark)
	defer tick.Stop()
	for {
		if s.watchEnded(req.URL.Path, gen) {
			return
		}
		entries, changed, gone := s.Store.since(from)
		if gone {
			ew.status(http.StatusGone, "Expired", fmt.Sprintf("too old resource version: %d", from))
			flush(flusher)
			return
		}
		for _, e := range entries {
			if e.resource == k.Resource && sel.matches(e.obj) {
				ew.event(e.typ, e.obj.raw)
			}
			from = e.obj.rv
		}
		if ew.err != nil {
			return
		}
		flush(flusher)
		select {
		case <-ctx.Done():
			return
		case <-changed:
		case <-tick.C:
			if bookmarks {
				ew.bookmark(s.Store.Current(), false)
				flush(flusher)
			}
		}
	}
}

func flush(f http.Flusher) {
	if f != nil {
		f.Flush()
	}
}

// eventWriter writes watch events; err is the first write's failure.
type eventWriter struct {
	w     io.Writer
	k     Kind
	s     *Server
	codec *Codec
	err   error
}

func (e *eventWriter) write(b []byte) {
	if e.err == nil {
		_, e.err = e.w.Write(b)
	}
}

func (e *eventWriter) send(typ string, obj []byte) {
	if e.codec != nil {
		b, err := e.codec.Event(typ, obj)
		if err != nil {
			e.err = errors.Join(e.err, err)
			return
		}
		e.write(b)
		return
	}
	var b bytes.Buffer
	fmt.Fprintf(&b, `{"type":%q,"object":`, typ)
	b.Write(obj)
	b.WriteString("}\n")
	e.write(b.Bytes())
}

func (e *eventWriter) event(typ string, raw []byte) {
	if e.codec != nil {
		e.send(typ, withKind(raw, e.k))
		return
	}
	e.send(typ, e.s.withKind(raw, e.k))
}

func (e *eventWriter) bookmark(rv uint64, initialEnd bool) {
	ann := ""
	if initialEnd {
		ann = `,"annotations":{"k8s.io/initial-events-end":"true"}`
	}
	e.send("BOOKMARK", fmt.Appendf(nil, `{"kind":%q,"apiVersion":%q,"metadata":{"resourceVersion":"%d"%s}}`,
		e.k.Kind, e.k.APIVersion(), rv, ann))
}

func (e *eventWriter) status(code int, reason, msg string) {
	b, _ := json.Marshal(statusBody(code, reason, msg))
	e.send("ERROR", b)
}

func statusBody(code int, reason, msg string) map[string]any {
	return map[string]any{"kind": "Status", "apiVersion": "v1", "metadata": map[string]any{},
		"status": "Failure", "message": msg, "reason": reason, "code": code}
}
