package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The KAFKA_TLS* and KAFKA_SASL_* settings are read and their files loaded
// at start; what is wrong names its variables and never shows the password.
func TestConfigKafkaSecurity(t *testing.T) {
	t.Parallel()
	sec, err := writeKafkaTestSecurity(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	file := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	const password = "s3cret-Pa55word"
	passwordFile, userFile, emptyFile := file("password", password+"\r\n"), file("user", "alice\n"), file("empty", "")

	c, err := loadTestConfig(map[string]string{
		"KAFKA_BROKERS": "kafka.example:9093", "KAFKA_TLS": "on", "KAFKA_TLS_CA_FILE": sec.caFile,
		"KAFKA_TLS_CERT_FILE": sec.clientCert, "KAFKA_TLS_KEY_FILE": sec.clientKey, "KAFKA_TLS_SERVER_NAME": "kafka.internal",
		"KAFKA_SASL_MECHANISM": "scram-sha-512", "KAFKA_SASL_USERNAME_FILE": userFile, "KAFKA_SASL_PASSWORD_FILE": passwordFile,
	})
	if err != nil {
		t.Fatal(err)
	}
	k := c.Kafka
	if k.SASLMechanism != "SCRAM-SHA-512" || k.SASLUsername != "alice" || k.SASLPassword != password {
		t.Errorf("SASL %q user %q password %q; want SCRAM-SHA-512, alice and the file's line", k.SASLMechanism, k.SASLUsername, k.SASLPassword)
	}
	if tc := k.tlsConfig; tc == nil || tc.RootCAs == nil || len(tc.Certificates) != 1 || tc.ServerName != "kafka.internal" {
		t.Errorf("TLS config %+v: want the CA, one client certificate and the server name", tc)
	}
	if n := len(kafkaClientOptions(k, c.KafkaBrokers)); n != 3 {
		t.Errorf("%d client options, want seed brokers, TLS and SASL", n)
	}
	if c, err := loadTestConfig(nil); err != nil || c.Kafka.TLS || c.Kafka.SASLMechanism != "" || len(kafkaClientOptions(c.Kafka, nil)) != 1 {
		t.Errorf("defaults: %v, %+v; want neither TLS nor SASL", err, c.Kafka)
	}

	tlsOn := map[string]string{"KAFKA_TLS": "on"}
	scram := map[string]string{"KAFKA_SASL_MECHANISM": "SCRAM-SHA-256", "KAFKA_SASL_USERNAME": "alice", "KAFKA_SASL_PASSWORD": password}
	for _, tc := range []struct {
		name string
		env  map[string]string
		want []string
	}{
		{"not a switch", map[string]string{"KAFKA_TLS": "maybe"}, []string{"KAFKA_TLS"}},
		{"CA without TLS", map[string]string{"KAFKA_TLS_CA_FILE": sec.caFile}, []string{"KAFKA_TLS_CA_FILE", "KAFKA_TLS=on"}},
		{"server name without TLS", map[string]string{"KAFKA_TLS_SERVER_NAME": "x"}, []string{"KAFKA_TLS_SERVER_NAME", "KAFKA_TLS=on"}},
		{"missing CA file", withEnv(tlsOn, map[string]string{"KAFKA_TLS_CA_FILE": filepath.Join(dir, "nope.pem")}), []string{"KAFKA_TLS_CA_FILE", "no such file"}},
		{"CA file without a certificate", withEnv(tlsOn, map[string]string{"KAFKA_TLS_CA_FILE": sec.clientKey}), []string{"KAFKA_TLS_CA_FILE", "no PEM certificate"}},
		{"certificate without key", withEnv(tlsOn, map[string]string{"KAFKA_TLS_CERT_FILE": sec.clientCert}), []string{"KAFKA_TLS_CERT_FILE", "KAFKA_TLS_KEY_FILE"}},
		{"key of another certificate", withEnv(tlsOn, map[string]string{"KAFKA_TLS_CERT_FILE": sec.clientCert, "KAFKA_TLS_KEY_FILE": filepath.Join(sec.dir, "keystore.pem")}),
			[]string{"KAFKA_TLS_CERT_FILE", "KAFKA_TLS_KEY_FILE", "does not match"}},
		{"unknown mechanism", withEnv(scram, map[string]string{"KAFKA_SASL_MECHANISM": "GSSAPI"}), []string{"KAFKA_SASL_MECHANISM", "SCRAM-SHA-512"}},
		{"mechanism without user", withEnv(scram, map[string]string{"KAFKA_SASL_USERNAME": ""}), []string{"KAFKA_SASL_USERNAME"}},
		{"mechanism without password", withEnv(scram, map[string]string{"KAFKA_SASL_PASSWORD": ""}), []string{"KAFKA_SASL_PASSWORD"}},
		{"credentials without mechanism", withEnv(scram, map[string]string{"KAFKA_SASL_MECHANISM": ""}), []string{"KAFKA_SASL_MECHANISM"}},
		{"password and its file", withEnv(scram, map[string]string{"KAFKA_SASL_PASSWORD_FILE": passwordFile}), []string{"KAFKA_SASL_PASSWORD and KAFKA_SASL_PASSWORD_FILE"}},
		{"missing password file", withEnv(scram, map[string]string{"KAFKA_SASL_PASSWORD": "", "KAFKA_SASL_PASSWORD_FILE": filepath.Join(dir, "nope")}),
			[]string{"KAFKA_SASL_PASSWORD_FILE", "no such file"}},
		{"empty user file", withEnv(scram, map[string]string{"KAFKA_SASL_USERNAME": "", "KAFKA_SASL_USERNAME_FILE": emptyFile}), []string{"KAFKA_SASL_USERNAME_FILE", "empty"}},
		{"PLAIN without TLS", withEnv(scram, map[string]string{"KAFKA_SASL_MECHANISM": "PLAIN"}), []string{"PLAIN", "KAFKA_TLS=on"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := loadTestConfig(tc.env)
			if err == nil {
				t.Fatalf("%v accepted", tc.env)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
			if strings.Contains(err.Error(), password) {
				t.Errorf("error %q shows the password", err)
			}
		})
	}
}

// The embedded broker speaks neither TLS nor SASL: asking for them without
// KAFKA_BROKERS stops `run` before it starts anything.
func TestKafkaSecurityNeedsKafkaBrokers(t *testing.T) {
	t.Parallel()
	dataDir := t.TempDir()
	for _, c := range []struct {
		vars map[string]string
		want string
	}{
		{map[string]string{"KAFKA_TLS": "on"}, "KAFKA_TLS=on needs KAFKA_BROKERS"},
		{map[string]string{"KAFKA_SASL_MECHANISM": "SCRAM-SHA-256", "KAFKA_SASL_USERNAME": "alice", "KAFKA_SASL_PASSWORD": "pw"},
			"KAFKA_SASL_MECHANISM=SCRAM-SHA-256 needs KAFKA_BROKERS"},
	} {
		vars := withEnv(c.vars, map[string]string{"PLAYWATCH_DATA_DIR": dataDir, "PLAYWATCH_HTTP_ADDR": freeAddr(t)})
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		var logs syncBuffer
		err := run(ctx, []string{"run"}, envFunc(vars), &logs, &logs)
		cancel()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: run returned %v, want %q", c.vars, err, c.want)
		}
	}
	if _, err := os.Stat(filepath.Join(dataDir, "postgres")); !os.IsNotExist(err) {
		t.Errorf("the managed PostgreSQL was set up before the check: %v", err)
	}
}
