package agent

import (
	"context"
	"log/slog"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/cni-usernet/cni-usernet/pkg/agent/podevent"
	"github.com/cni-usernet/cni-usernet/pkg/api/state"
)

// refusedEvent tells the pod, as a Warning Event, that the agent will not
// restart its stack and why (supervisor.Config.Refused); logged when the API
// server cannot be told.
func refusedEvent(c *apiClient, node string, log *slog.Logger) func(*state.Attachment, string) {
	return func(att *state.Attachment, why string) {
		if c == nil || att.PodName == "" || node == "" {
			return
		}
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			uid, err := c.podUID(ctx, att.PodNS, att.PodName)
			if err == nil {
				err = c.event(ctx, podevent.Event{Namespace: att.PodNS, PodName: att.PodName, PodUID: uid,
					Type: corev1.EventTypeWarning, Reason: "StackNotRestarted", Message: why, Action: "RestartStack", Node: node})
			}
			if err != nil {
				log.Warn("cannot post the refused restart as an Event", "pod", att.PodNS+"/"+att.PodName, "reason", apiFailure(err), "err", err)
			}
		}()
	}
}
