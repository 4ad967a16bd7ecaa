package fakeapi

import (
	"fmt"
	"strings"
)

// selector is what a list or watch asks for: a namespace (from the path),
// a fieldSelector and a labelSelector, of the forms the clients use.
type selector struct {
	ns     string
	fields []requirement // metadata.name, metadata.namespace, spec.nodeName
	labels []requirement
}

// requirement is one term of a selector: key op value; op is "=", "!=",
// "exists" or "!exists".
type requirement struct {
	key, op, value string
}

// parseSelector reads a selector's terms: k=v, k==v, k!=v, k, !k. Set
// terms (in, notin) are refused: the server would answer wrongly.
func parseSelector(s string) ([]requirement, error) {
	var out []requirement
	for _, t := range strings.Split(s, ",") {
		t = strings.TrimSpace(t)
		switch {
		case t == "":
		case strings.Contains(t, "!="):
			k, v, _ := strings.Cut(t, "!=")
			out = append(out, requirement{k, "!=", v})
		case strings.Contains(t, "=="):
			k, v, _ := strings.Cut(t, "==")
			out = append(out, requirement{k, "=", v})
		case strings.Contains(t, "="):
			k, v, _ := strings.Cut(t, "=")
			out = append(out, requirement{k, "=", v})
		case strings.Contains(t, " ") || strings.Contains(t, "("):
			return nil, fmt.Errorf("selector term %q: only k=v, k!=v, k and !k are served", t)
		case strings.HasPrefix(t, "!"):
			out = append(out, requirement{t[1:], "!exists", ""})
		default:
			out = append(out, requirement{t, "exists", ""})
		}
	}
	return out, nil
}

func newSelector(ns, fields, labels string) (selector, error) {
	sel := selector{ns: ns}
	var err error
	if sel.fields, err = parseSelector(fields); err != nil {
		return sel, fmt.Errorf("fieldSelector: %w", err)
	}
	for _, r := range sel.fields {
		switch r.key {
		case "metadata.name", "metadata.namespace", "spec.nodeName":
		default:
			return sel, fmt.Errorf("fieldSelector: field %q is not served", r.key)
		}
	}
	if sel.labels, err = parseSelector(labels); err != nil {
		return sel, fmt.Errorf("labelSelector: %w", err)
	}
	return sel, nil
}

func (s selector) matches(o *stored) bool {
	if s.ns != "" && o.ns != s.ns {
		return false
	}
	for _, r := range s.fields {
		var v string
		switch r.key {
		case "metadata.name":
			v = o.name
		case "metadata.namespace":
			v = o.ns
		case "spec.nodeName":
			v = o.nodeName
		}
		if (r.op == "=") != (v == r.value) {
			return false
		}
	}
	for _, r := range s.labels {
		v, ok := o.labels[r.key]
		switch r.op {
		case "=":
			if !ok || v != r.value {
				return false
			}
		case "!=":
			if ok && v == r.value {
				return false
			}
		case "exists":
			if !ok {
				return false
			}
		case "!exists":
			if ok {
				return false
			}
		}
	}
	return true
}
