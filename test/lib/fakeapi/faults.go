package fakeapi

import (
	"encoding/json"
	"maps"
	"net/http"
	"net/url"
	"slices"
)

// Request is one request as the server got it.
type Request struct {
	Method, Path string
	Query        url.Values
	Header       http.Header
	// ClientCert is the client certificate's common name, if it sent
	// one.
	ClientCert string
	// Body is what a request other than a GET sent (its first MiB).
	Body []byte
}

// Event is an Event a client created (POST) or updated (PATCH).
type Event struct {
	Method, Namespace, Name string
	Body                    json.RawMessage
}

// Fault is an answer the server gives instead of serving: Code with a
// Status of Reason and Message. A fault ends the open watches it
// matches.
type Fault struct {
	Code            int
	Reason, Message string
	// Times is how many requests get it; zero: until it is cleared.
	Times int
	// Body, when not nil, is sent instead of a Status, as a proxy or a
	// server in trouble answers (empty: no body at all).
	Body []byte
}

// SetTokens makes toks the bearer tokens accepted, the others 401; none:
// every token is refused.
func (s *Server) SetTokens(toks ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.tokens = map[string]bool{}
	for _, t := range toks {
		s.tokens[t] = true
	}
}

// Tokens are the bearer tokens sent, one per request, in order.
func (s *Server) Tokens() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.seen)
}

// Requests are the requests received, in order.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.requests)
}

// Count is how many requests of "verb resource" were served: "list
// pods", "watch pods", "get nodes", "create events", "get version".
func (s *Server) Count(what string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.counts[what]
}

// Counts are the served requests by "verb resource", and the unknown
// ones by "METHOD path", answered 404.
func (s *Server) Counts() (served, unknown map[string]int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.counts), maps.Clone(s.unknown)
}

// Events are the Events created or updated, in order.
func (s *Server) Events() []Event {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.events)
}

// EventBodies are the Events' bodies, decoded.
func (s *Server) EventBodies() []map[string]any {
	var out []map[string]any
	for _, e := range s.Events() {
		var m map[string]any
		json.Unmarshal(e.Body, &m)
		out = append(out, m)
	}
	return out
}

// SetFault answers f to the requests of path (as the client sends it:
// /api/v1/pods; "" every request) until cleared with nil, and ends the
// watches of path.
func (s *Server) SetFault(path string, f *Fault) {
	s.mu.Lock()
	if f == nil {
		delete(s.faults, path)
	} else {
		c := *f
		s.faults[path] = &c
	}
	s.mu.Unlock()
	s.Store.wake()
}

// SetDown answers 503 to everything while down, as an API server away.
func (s *Server) SetDown(down bool) {
	if down {
		s.SetFault("", &Fault{Code: http.StatusServiceUnavailable, Reason: "ServiceUnavailable", Message: "the API server is away"})
	} else {
		s.SetFault("", nil)
	}
}

// Refused is how many requests a fault answered.
func (s *Server) Refused() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.refused
}

// CloseWatches ends the open watches, as an API server restarting does;
// clients watch again.
func (s *Server) CloseWatches() {
	s.mu.Lock()
	s.watchGen++
	s.mu.Unlock()
	s.Store.wake()
}

// SetRaw puts h ahead of everything (after the request is recorded): a
// request h answers (returning true) is not served otherwise. For the
// answers no API server gives but clients must survive.
func (s *Server) SetRaw(h func(http.ResponseWriter, *http.Request) bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.raw = h
}

// fault is the fault a request of path gets now, counted.
func (s *Server) fault(path string) *Fault {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range []string{path, ""} {
		f := s.faults[p]
		if f == nil {
			continue
		}
		s.refused++
		if f.Times > 0 {
			if f.Times--; f.Times == 0 {
				delete(s.faults, p)
			}
		}
		return f
	}
	return nil
}

// watchEnded says whether a watch of path started at generation gen must
// end: a fault of its path, CloseWatches, Close.
func (s *Server) watchEnded(path string, gen int) bool {
	select {
	case <-s.done:
		return true
	default:
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.watchGen != gen || s.faults[path] != nil || s.faults[""] != nil
}
