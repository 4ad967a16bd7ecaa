package cni

import (
	"encoding/json"
	"errors"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/cni-usernet/cni-usernet/pkg/api/agentapi"
	"github.com/cni-usernet/cni-usernet/pkg/api/netconf"
)

// recorded times a verb and appends its result to the state directory's
// operation log, which the node agent folds into its latency histograms
// (the plugin is gone before anyone could scrape it). A record that
// cannot be written is dropped: metrics never fail a pod.
func recorded(verb string, f func(*skel.CmdArgs) error) func(*skel.CmdArgs) error {
	return func(args *skel.CmdArgs) error {
		start := time.Now()
		err := f(args)
		_ = agentapi.Append(stateDirOf(args.StdinData), agentapi.Record{Verb: verb, Result: resultOf(err), Duration: time.Since(start)})
		return err
	}
}

// stateDirOf reads only the state directory: the configuration may be one
// the verb refused.
func stateDirOf(conf []byte) string {
	var c struct {
		StateDir string `json:"stateDir"`
	}
	if json.Unmarshal(conf, &c) != nil || c.StateDir == "" {
		return netconf.DefaultStateDir
	}
	return c.StateDir
}

func resultOf(err error) string {
	var te *types.Error
	switch {
	case err == nil:
		return agentapi.ResultSuccess
	case errors.As(err, &te) && te.Code == types.ErrTryAgainLater:
		return agentapi.ResultTryAgainLater
	}
	return agentapi.ResultError
}
