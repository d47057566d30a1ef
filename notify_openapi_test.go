package main

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
)

// api/openapi.json says what the notifier sends: a rule's events as an
// enum, a notification's event (digest too), and the webhook body's digest
// and test events.
func TestOpenAPINotifyEvents(t *testing.T) {
	type schema struct {
		Description string            `json:"description"`
		Type        json.RawMessage   `json:"type"`
		Enum        []string          `json:"enum"`
		Properties  map[string]schema `json:"properties"`
	}
	s := openAPISchemas[schema](t)
	if e := s["NotifyEvent"]; string(e.Type) != `"string"` || !slices.Equal(e.Enum, notifyEvents) {
		t.Errorf("NotifyEvent %+v, want a string enum of %v", e, notifyEvents)
	}
	if e := s["Notification"].Properties["event"]; !slices.Equal(e.Enum, append(slices.Clone(notifyEvents), "digest")) {
		t.Errorf("Notification.event %+v, want the rule events and digest", e)
	}
	desc := s["NewWebhookDestination"].Description
	for _, want := range []string{"digest", `"count"`, `"of"`, `"apps"`, "test", "X-Playwatch-Signature"} {
		if !strings.Contains(desc, want) {
			t.Errorf("the webhook body's description does not say %s: %s", want, desc)
		}
	}
}
