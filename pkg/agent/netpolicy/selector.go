package netpolicy

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// The operators of a LabelSelectorRequirement.
const (
	opIn           = "In"
	opNotIn        = "NotIn"
	opExists       = "Exists"
	opDoesNotExist = "DoesNotExist"
)

// selector is a LabelSelector checked once and ready to match: metav1's
// LabelSelectorAsSelector semantics (every requirement must hold; an empty
// selector matches everything).
type selector struct {
	reqs []requirement
	// nothing is set for a selector the API would refuse (an unknown
	// operator, In without values): it matches no object, so that a bad
	// peer opens nothing.
	nothing bool
}

type requirement struct {
	key    string
	op     string
	values []string // sorted
}

// newSelector checks s. A selector the API server would refuse is returned
// as matching nothing, with the reason.
func newSelector(s *LabelSelector) (selector, error) {
	var sel selector
	for k, v := range s.MatchLabels {
		sel.reqs = append(sel.reqs, requirement{key: k, op: opIn, values: []string{v}})
	}
	for _, r := range s.MatchExpressions {
		switch r.Operator {
		case opIn, opNotIn:
			if len(r.Values) == 0 {
				return selector{nothing: true}, fmt.Errorf("label selector: %s %s without values", r.Key, r.Operator)
			}
		case opExists, opDoesNotExist:
			if len(r.Values) != 0 {
				return selector{nothing: true}, fmt.Errorf("label selector: %s %s with values", r.Key, r.Operator)
			}
		default:
			return selector{nothing: true}, fmt.Errorf("label selector: unknown operator %q on key %q", r.Operator, r.Key)
		}
		values := slices.Clone(r.Values)
		slices.Sort(values)
		sel.reqs = append(sel.reqs, requirement{key: r.Key, op: r.Operator, values: slices.Compact(values)})
	}
	slices.SortFunc(sel.reqs, func(a, b requirement) int {
		if c := strings.Compare(a.key, b.key); c != 0 {
			return c
		}
		if c := strings.Compare(a.op, b.op); c != 0 {
			return c
		}
		return slices.Compare(a.values, b.values)
	})
	return sel, nil
}

// canonical is what sel matches as a string, for sharing the pods it
// selects between the peers that use it: two selectors with the same
// canonical form match the same objects.
func (sel *selector) canonical() string {
	if sel.nothing {
		return "!"
	}
	var b []byte
	for _, r := range sel.reqs {
		// Quoted, so that keys and values holding the separators stay
		// apart.
		b = strconv.AppendQuote(b, r.key)
		b = append(b, ' ')
		b = append(b, r.op...)
		for _, v := range r.values {
			b = append(b, ' ')
			b = strconv.AppendQuote(b, v)
		}
		b = append(b, ';')
	}
	return string(b)
}

// everything reports whether sel matches every object.
func (sel *selector) everything() bool { return !sel.nothing && len(sel.reqs) == 0 }

func (sel *selector) matches(labels map[string]string) bool {
	if sel.nothing {
		return false
	}
	for _, r := range sel.reqs {
		v, ok := labels[r.key]
		switch r.op {
		case opIn:
			if !ok || !slices.Contains(r.values, v) {
				return false
			}
		case opNotIn:
			// NotIn holds for an object without the label, as in metav1.
			if ok && slices.Contains(r.values, v) {
				return false
			}
		case opExists:
			if !ok {
				return false
			}
		case opDoesNotExist:
			if ok {
				return false
			}
		}
	}
	return true
}
