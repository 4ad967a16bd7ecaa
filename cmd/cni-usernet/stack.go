package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/cni-usernet/cni-usernet/pkg/launch"
	"github.com/cni-usernet/cni-usernet/pkg/podstack"
)

// runStack is the pod's stack process. It reports readiness on
// launch.ReadyFD when a launcher passed one.
func runStack(argv []string) error {
	fs := flag.NewFlagSet("stack", flag.ContinueOnError)
	configPath := fs.String("config", "", "stack configuration file (JSON)")
	debug := fs.Bool("debug", false, "log at debug level")
	if err := fs.Parse(argv); err != nil {
		return err
	}
	level := slog.LevelInfo
	if *debug {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: level})).With("pid", os.Getpid())
	ready := os.NewFile(launch.ReadyFD, "ready")
	report := func(line string) {
		if ready != nil {
			fmt.Fprintln(ready, line)
			ready.Close()
			ready = nil
		}
	}
	cfg, err := podstack.ReadConfig(*configPath)
	if err != nil {
		report("error: " + err.Error())
		return err
	}
	log = log.With("ifName", cfg.IfName)
	d, err := podstack.Start(*cfg, log)
	if err != nil {
		log.Error("stack failed to start", "err", err)
		report("error: " + err.Error())
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	log.Info("stack ready")
	report("ok")
	d.Run(ctx)
	return nil
}
