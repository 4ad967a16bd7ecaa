package fakeapi

import "testing"

func TestSelectorParse(t *testing.T) {
	o := &stored{ns: "a", name: "p", nodeName: "n1", labels: map[string]string{"app": "x", "tier": "frontend"}}
	for sel, want := range map[string]bool{
		"app=x": true, "app==x": true, "app!=x": false, "app=y": false, "tier": true, "!tier": false,
		"missing": false, "!missing": true, "app=x,tier=frontend": true, "app=x,tier=backend": false,
	} {
		s, err := newSelector("", "", sel)
		if err != nil {
			t.Fatalf("%q: %v", sel, err)
		}
		if got := s.matches(o); got != want {
			t.Errorf("labelSelector %q: %t, want %t", sel, got, want)
		}
	}
	for sel, want := range map[string]bool{"spec.nodeName=n1": true, "spec.nodeName!=n1": false, "metadata.name=p,metadata.namespace=a": true} {
		s, err := newSelector("", sel, "")
		if err != nil {
			t.Fatalf("%q: %v", sel, err)
		}
		if got := s.matches(o); got != want {
			t.Errorf("fieldSelector %q: %t, want %t", sel, got, want)
		}
	}
	if _, err := newSelector("", "", "app in (x,y)"); err == nil {
		t.Errorf("a set-based selector: no error, want it refused")
	}
	if _, err := newSelector("", "status.phase=Running", ""); err == nil {
		t.Errorf("an unserved field: no error")
	}
}
