module github.com/rebound-mq/rebound

go 1.24.0

require (
	github.com/caarlos0/env/v11 v11.4.0 // indirect
	github.com/prometheus/client_golang v1.23.2 // indirect
	github.com/rabbitmq/amqp091-go v1.16.0 // indirect
	go.uber.org/multierr v1.10.0 // indirect
	go.uber.org/zap v1.28.0 // indirect
)
