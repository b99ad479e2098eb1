package consumer

import (
	"go.uber.org/zap"

	"github.com/rebound-mq/rebound/config"
	"github.com/rebound-mq/rebound/headers"
)

// OptionsFrom returns the Options a validated configuration describes,
// with log and m. It reads the TLS files the configuration names; a file
// that cannot be used is a configuration error. `rebound run` and the
// bench both build their sidecar with it.
func OptionsFrom(cfg config.Config, log *zap.Logger, m *Metrics) (Options, error) {
	tlsConfig, err := cfg.TLS()
	if err != nil {
		return Options{}, err
	}
	return Options{
		URLs:           cfg.BrokerURLs(),
		TLS:            tlsConfig,
		Topology:       cfg.Topology(),
		Policy:         cfg.Policy(),
		Codec:          headers.NewCodec(cfg.HeaderNames()),
		Prefetch:       cfg.Prefetch,
		ConfirmTimeout: cfg.ConfirmTimeout,
		ShutdownGrace:  cfg.ShutdownGrace,
		DelayQueueIdle: cfg.DelayQueueIdle,
		OriginAllowed:  cfg.OriginAllowed(),
		Logger:         log,
		Metrics:        m,
	}, nil
}

// ReadHeaders lists the headers the sidecar reads, whose problems it
// counts: the ones to pass to NewMetrics.
func ReadHeaders(n headers.Names) []string {
	return []string{n.RetryCount, n.TaskStartedAt, n.LastDelay, n.OriginQueue, n.NonRetryable, headers.XDeath, headers.XFirstDeathQueue}
}
