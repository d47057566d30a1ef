package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// A destination is where a rule's messages go (schema.sql, migration 12):
// its public fields live in notify_destinations.config, its secrets in
// notify_destination_secrets, which playwatch_reader is not granted.
type destination struct {
	ID        int64
	Name      string
	Type      string // webhook, slack, discord, telegram, email
	Config    destinationConfig
	Status    string // ok, broken
	LastError string
	CreatedAt time.Time
	UpdatedAt time.Time
}

// destinationConfig holds every type's fields; each type uses its own.
// The secret ones are split off by secretsOf before they are stored.
type destinationConfig struct {
	URL      string   `json:"url,omitempty"`    // webhook, slack, discord (secret for slack and discord: its path is the credential)
	Secret   string   `json:"secret,omitempty"` // webhook (secret)
	BotToken string   `json:"bot_token,omitempty"`
	ChatID   string   `json:"chat_id,omitempty"`
	SMTPHost string   `json:"smtp_host,omitempty"`
	SMTPPort int      `json:"smtp_port,omitempty"`
	TLS      string   `json:"tls,omitempty"` // starttls, implicit, none
	Username string   `json:"username,omitempty"`
	Password string   `json:"password,omitempty"` // email (secret)
	From     string   `json:"from,omitempty"`
	To       []string `json:"to,omitempty"`
}

// destinationSecrets are the fields of a destinationConfig that are
// write-only: stored apart, masked in every answer and log.
type destinationSecrets struct {
	URL      string `json:"url,omitempty"`
	Secret   string `json:"secret,omitempty"`
	BotToken string `json:"bot_token,omitempty"`
	Password string `json:"password,omitempty"`
}

// urlIsSecret says whether a type's URL is a credential (Slack and
// Discord webhooks: whoever has the URL can post).
func urlIsSecret(typ string) bool { return typ == "slack" || typ == "discord" }

// secretsOf splits c into what notify_destinations.config stores and what
// notify_destination_secrets stores.
func secretsOf(typ string, c destinationConfig) (public destinationConfig, secrets destinationSecrets) {
	public = c
	secrets = destinationSecrets{Secret: c.Secret, BotToken: c.BotToken, Password: c.Password}
	public.Secret, public.BotToken, public.Password = "", "", ""
	if urlIsSecret(typ) {
		secrets.URL, public.URL = c.URL, ""
	}
	return public, secrets
}

// withSecrets puts the stored secrets back into a public config.
func withSecrets(public destinationConfig, s destinationSecrets) destinationConfig {
	c := public
	c.Secret, c.BotToken, c.Password = s.Secret, s.BotToken, s.Password
	if s.URL != "" {
		c.URL = s.URL
	}
	return c
}

var errDestinationNotFound = errors.New("destination not found")

// destinationColumns and scanDestination read a notify_destinations row
// joined with its secrets (alias d and s).
const destinationColumns = `d.id, d.name, d.type, d.config, coalesce(s.secrets, '{}'), d.status, coalesce(d.last_error, ''), d.created_at, d.updated_at`

func scanDestination(row pgx.CollectableRow) (destination, error) {
	var d destination
	var public, secret []byte
	if err := row.Scan(&d.ID, &d.Name, &d.Type, &public, &secret, &d.Status, &d.LastError, &d.CreatedAt, &d.UpdatedAt); err != nil {
		return destination{}, err
	}
	var pc destinationConfig
	var sc destinationSecrets
	if err := json.Unmarshal(public, &pc); err != nil {
		return destination{}, fmt.Errorf("destination %d: config: %w", d.ID, err)
	}
	if err := json.Unmarshal(secret, &sc); err != nil {
		return destination{}, fmt.Errorf("destination %d: secrets: %w", d.ID, err)
	}
	d.Config = withSecrets(pc, sc)
	return d, nil
}

// loadDestination reads one destination with its secrets.
func loadDestination(ctx context.Context, q querier, id int64) (destination, error) {
	return loadOne(ctx, q, "destination", id, errDestinationNotFound, scanDestination, `SELECT `+destinationColumns+`
FROM notify_destinations d LEFT JOIN notify_destination_secrets s ON s.destination_id = d.id WHERE d.id = $1`)
}
