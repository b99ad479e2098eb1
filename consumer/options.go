package consumer

import (
	"go.uber.org/zap"

	"github.com/rebound-mq/rebound/config"
	"github.com/rebound-mq/rebound/internal/dialer"
)

// OptionsFrom returns the Options a validated configuration describes,
// with dialer, log and m. `rebound run` and the bench both build their
// sidecar with it.
func OptionsFrom(cfg config.Config, dialer *dialer.Dialer, log *zap.Logger, m *Metrics) Options {
	return Options{
		Dialer:             dialer,
		Router:             cfg.Router(),
		Prefetch:           cfg.Prefetch,
		InflightBytes:      int64(cfg.InflightBytes),
		ConfirmTimeout:     cfg.ConfirmTimeout,
		ShutdownGrace:      cfg.ShutdownGrace,
		DelayQueueIdle:     cfg.DelayQueueIdle,
		EventsExchange:     cfg.EventsExchange,
		EventsFormat:       cfg.EventsFormat,
		EventsSource:       EventsSource(cfg.Vhost(), cfg.InboxQueue),
		Logger:             log,
		Metrics:            m,
		MetricsOrigins:     cfg.MetricsOriginsRegexp(),
		MetricsOriginLimit: cfg.MetricsOriginLimit,
	}
}
