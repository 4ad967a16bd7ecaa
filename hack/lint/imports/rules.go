// Command imports checks the import rule between cni-usernet's processes:
// code that runs on the host side (the CNI plugin the runtime runs at
// every ADD, the node agent, the operator's commands, the contracts and
// node libraries they share) never links a pod stack's packages or
// gVisor; the plugin's binary links no client-go and nothing of the
// agent; and no package a process shares depends on one process's own
// packages. `make lint` runs
// it; docs/architecture.md ("Layout") gives the groups.
package main

import (
	"fmt"
	"sort"
	"strings"
)

// Module is the module path the rules speak of.
const Module = "github.com/cni-usernet/cni-usernet"

// Package is one package with every package it links (go list's Deps:
// transitive, test files excluded).
type Package struct {
	ImportPath string
	Deps       []string
}

// rule forbids the packages From matches to link any package Forbid
// matches; Why is the reason the report gives.
type rule struct {
	From, Forbid func(string) bool
	Why          string
}

func under(groups ...string) func(string) bool {
	return func(p string) bool {
		for _, g := range groups {
			full := Module + "/" + g
			if p == full || strings.HasPrefix(p, full+"/") {
				return true
			}
		}
		return false
	}
}

func prefix(ps ...string) func(string) bool {
	return func(p string) bool {
		for _, x := range ps {
			if p == x || strings.HasPrefix(p, x+"/") {
				return true
			}
		}
		return false
	}
}

var rules = []rule{
	{under("cmd/cni-usernet", "cmd/cni-usernet-agent", "pkg/cni", "pkg/agent", "pkg/api", "pkg/node", "pkg/cli", "pkg/util"), under("pkg/stack"),
		"host-side code talks to a stack through pkg/api, never through the stack's packages"},
	{under("cmd/cni-usernet", "cmd/cni-usernet-agent", "pkg/cni", "pkg/agent", "pkg/api", "pkg/node", "pkg/cli", "pkg/util"), prefix("gvisor.dev/gvisor"),
		"netstack and the sandbox belong to the stack's binary alone"},
	{under("cmd/cni-usernet", "pkg/cni"), prefix("k8s.io/client-go"),
		"the binary the runtime runs at every ADD stays small: no client-go"},
	{under("pkg/api", "pkg/node", "pkg/util"), under("pkg/cni", "pkg/agent", "pkg/stack", "pkg/cli"),
		"contracts and shared node code depend on no one process"},
	{under("pkg/api"), under("pkg/node", "pkg/stack"),
		"contracts are types, parsing and validation: the kernel work and the enforcement they describe live in pkg/node and pkg/stack"},
	{under("pkg/stack"), under("pkg/cni", "pkg/agent", "pkg/cli"),
		"a pod's stack links none of the host-side processes"},
	{under("cmd/cni-usernet", "pkg/cni", "pkg/cli"), under("pkg/agent"),
		"the plugin's binary carries none of the agent: it reaches the agent through pkg/api/agentapi, and what both run is node code (pkg/node)"},
	{under("pkg/cni"), under("pkg/cli"), "the plugin's verbs do not run the operator's commands"},
	{under("pkg/agent"), under("pkg/cni", "pkg/cli"), "the agent does not run the plugin's verbs"},
}

// Violations lists every package that breaks a rule, one line each.
func Violations(pkgs []Package) []string {
	var out []string
	for _, p := range pkgs {
		for _, r := range rules {
			if !r.From(p.ImportPath) {
				continue
			}
			var bad []string
			for _, d := range p.Deps {
				if r.Forbid(d) {
					bad = append(bad, d)
				}
			}
			if len(bad) > 0 {
				sort.Strings(bad)
				more := ""
				if len(bad) > 3 {
					more = fmt.Sprintf(" and %d more", len(bad)-3)
					bad = bad[:3]
				}
				out = append(out, fmt.Sprintf("%s links %s%s: %s", p.ImportPath, strings.Join(bad, ", "), more, r.Why))
			}
		}
	}
	return out
}
