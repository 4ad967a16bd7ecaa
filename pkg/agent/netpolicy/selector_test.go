package netpolicy

import (
	"slices"
	"testing"
)

func TestSelector(t *testing.T) {
	objs := map[string]map[string]string{
		"none":   nil,
		"web":    {"app": "web", "tier": "front"},
		"db":     {"app": "db"},
		"cache":  {"app": "cache", "tier": "back"},
		"legacy": {"tier": "front"},
	}
	tests := []struct {
		name string
		sel  LabelSelector
		want []string // the objects matched, in the order of names below
	}{
		{"empty selects everything", LabelSelector{}, []string{"cache", "db", "legacy", "none", "web"}},
		{"matchLabels", LabelSelector{MatchLabels: map[string]string{"app": "web"}}, []string{"web"}},
		{"matchLabels, all must hold", LabelSelector{MatchLabels: map[string]string{"app": "web", "tier": "back"}}, nil},
		{"In", *expr("app", "In", "web", "db"), []string{"db", "web"}},
		{"NotIn holds without the label", *expr("app", "NotIn", "web", "db"), []string{"cache", "legacy", "none"}},
		{"Exists", *expr("tier", "Exists"), []string{"cache", "legacy", "web"}},
		{"DoesNotExist", *expr("tier", "DoesNotExist"), []string{"db", "none"}},
		{"matchLabels and matchExpressions: AND", LabelSelector{
			MatchLabels:      map[string]string{"tier": "front"},
			MatchExpressions: []LabelSelectorRequirement{{Key: "app", Operator: "Exists"}},
		}, []string{"web"}},
		{"unknown operator selects nothing", *expr("app", "Like", "w*"), nil},
		{"In without values selects nothing", *expr("app", "In"), nil},
		{"NotIn without values selects nothing", *expr("app", "NotIn"), nil},
		{"Exists with values selects nothing", *expr("app", "Exists", "web"), nil},
		{"operators are case-sensitive", *expr("app", "in", "web"), nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sel, err := newSelector(&tt.sel)
			if (err != nil) != sel.nothing {
				t.Errorf("error %v with nothing %v", err, sel.nothing)
			}
			var got []string
			for _, name := range []string{"cache", "db", "legacy", "none", "web"} {
				if sel.matches(objs[name]) {
					got = append(got, name)
				}
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("got %v, want %v", got, tt.want)
			}
		})
	}
}

func TestSelectorCanon(t *testing.T) {
	// The same selector written two ways shares its pods; different ones
	// never do.
	a, _ := newSelector(&LabelSelector{MatchLabels: map[string]string{"b": "2", "a": "1"}})
	b, _ := newSelector(&LabelSelector{MatchExpressions: []LabelSelectorRequirement{{Key: "a", Operator: "In", Values: []string{"1"}}, {Key: "b", Operator: "In", Values: []string{"2"}}}})
	if a.canonical() != b.canonical() {
		t.Errorf("got %q and %q for the same selector", a.canonical(), b.canonical())
	}
	c, _ := newSelector(&LabelSelector{MatchLabels: map[string]string{"a": "1;\"b\" In [\"2\"]"}})
	if a.canonical() == c.canonical() {
		t.Errorf("got %q for two selectors", a.canonical())
	}
}
