package main

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// A rule of two apps past max_per_hour: what was held back of both goes out
// as ONE digest when a slot frees, with the count per app, and the digest
// takes that slot: the hour's next message waits.
func TestNotifyDeliveryOneDigestForEveryApp(t *testing.T) {
	t.Parallel()
	pool := newTestPool(t)
	recv := newWebhookReceiver(t)
	dest := seedDestination(t, pool, "webhook", recv.srv.URL)
	rule := seedRule(t, pool, 2, dest)
	seed := func(prefix string, pkgs ...string) {
		t.Helper()
		for i, pkg := range pkgs {
			p := notifyPayload{Event: "review", App: payloadApp{PackageName: pkg, DisplayName: "App " + pkg, Country: "us", Lang: "en"},
				Review: &payloadReview{ReviewID: fmt.Sprintf("%s%d", prefix, i), Stars: 1, Text: "bad"},
				Links:  payloadLinks{Play: playURL(pkg, "en", ""), StatusPage: "https://pw.example/apps/" + pkg}}
			b, _ := json.Marshal(p)
			mustExec(t, pool, `INSERT INTO notifications (rule_id, destination_id, event, event_key, payload, event_at)
VALUES ($1, $2, 'review', $3, $4, now())`, rule, dest, fmt.Sprintf("review:%s%d:h", prefix, i), b)
		}
	}
	seed("a", "com.a", "com.b", "com.a", "com.b", "com.a", "com.a")
	runDelivery(t, pool, newTestSender(t), testDeliveryConfig(), prometheus.NewRegistry())
	waitFor(t, 10*time.Second, "two sent, four held back", func() bool {
		return count(t, pool, `SELECT count(*) FROM notifications WHERE status = 'sent'`) == 2 &&
			count(t, pool, `SELECT count(*) FROM notifications WHERE status = 'pending' AND last_error = $1`, notifyThrottleNote) == 4
	})
	mustExec(t, pool, `UPDATE notifications SET sent_at = sent_at - interval '1 hour' WHERE status = 'sent'`)
	mustExec(t, pool, `UPDATE notifications SET next_attempt_at = now() WHERE status = 'pending'`)
	waitFor(t, 10*time.Second, "the digest sent", func() bool {
		return count(t, pool, `SELECT count(*) FROM notifications WHERE status = 'sent' AND event = 'digest'`) >= 1 &&
			count(t, pool, `SELECT count(*) FROM notifications WHERE status = 'pending'`) == 0
	})
	time.Sleep(200 * time.Millisecond)
	ms := recv.messages()
	if len(ms) != 3 {
		t.Fatalf("receiver got %d messages, want 2 and one digest", len(ms))
	}
	d := ms[2].Payload
	if d.Event != "digest" || d.Digest == nil || d.Digest.Count != 4 || len(d.Digest.Apps) != 2 ||
		d.Digest.Apps[0].Count+d.Digest.Apps[1].Count != 4 || d.Links.StatusPage != "https://pw.example/" {
		t.Fatalf("digest %+v %+v", d, d.Digest)
	}
	if m := buildNotifyMessage(d); m.Title != "and 4 more reviews of 2 apps in the last hour" || len(m.Facts) != 2 {
		t.Errorf("digest message %+v", m)
	}
	// The digest took a slot of the hour: of two new messages one goes.
	seed("b", "com.a", "com.b")
	waitFor(t, 10*time.Second, "one more sent, one held", func() bool {
		return count(t, pool, `SELECT count(*) FROM notifications WHERE status = 'pending' AND last_error = $1`, notifyThrottleNote) == 1
	})
	time.Sleep(200 * time.Millisecond)
	if n := len(recv.messages()); n != 4 {
		t.Fatalf("receiver got %d messages, want 4: the digest counts against max_per_hour", n)
	}
}
