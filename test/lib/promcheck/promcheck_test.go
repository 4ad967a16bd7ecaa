package promcheck

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// The lint must be able to fail: a counter without _total and a
// non-base unit are what promlint exists to catch.
func TestLintFindsProblems(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		fmt.Fprint(w, "# HELP x_requests Requests.\n# TYPE x_requests counter\nx_requests 1\n"+
			"# HELP x_latency_milliseconds Latency.\n# TYPE x_latency_milliseconds gauge\nx_latency_milliseconds 3\n")
	}))
	defer srv.Close()
	s, err := Get(nil, srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	problems, checked, err := s.Lint()
	if err != nil {
		t.Fatal(err)
	}
	all := strings.Join(problems, "\n")
	for _, want := range []string{"x_requests", "x_latency_milliseconds"} {
		if !strings.Contains(all, want) {
			t.Errorf("%s: no problem found with %s; got:\n%s", checked, want, all)
		}
	}
}
