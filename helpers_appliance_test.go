package main

// `playwatch run` as a child process of a test (the fault tests, the managed
// PostgreSQL's kill tests, the fleet benchmark): its build, start, log and
// stop; and the environment of an appliance, also of one in the test's
// process (startRun).

import (
	"fmt"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// buildPlaywatch builds the binary into a temp dir.
func buildPlaywatch(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "playwatch")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// appliance is `playwatch run` as a child process of the test.
type appliance struct {
	cmd    *exec.Cmd
	base   string        // http://PLAYWATCH_HTTP_ADDR
	exited chan struct{} // closed when the process has been reaped
	err    error         // its exit status, once exited
}

// startAppliance starts `playwatch run args...` with env, its output
// appended to logPath, and waits until /readyz answers 200.
func startAppliance(t *testing.T, bin string, env map[string]string, logPath string, args ...string) *appliance {
	t.Helper()
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close() // the child has its own descriptor
	fmt.Fprintf(logFile, "==== playwatch run %s\n", strings.Join(args, " "))
	a := &appliance{cmd: exec.Command(bin, append([]string{"run"}, args...)...), base: "http://" + env["PLAYWATCH_HTTP_ADDR"], exited: make(chan struct{})}
	a.cmd.Env = os.Environ()
	for k, v := range env {
		a.cmd.Env = append(a.cmd.Env, k+"="+v)
	}
	a.cmd.Stdout, a.cmd.Stderr = logFile, logFile
	a.cmd.SysProcAttr = childProcAttr(false)
	if err := a.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		a.err = a.cmd.Wait()
		close(a.exited)
	}()
	t.Cleanup(func() {
		if a.running() {
			a.cmd.Process.Kill()
			<-a.exited
		}
	})
	deadline := time.Now().Add(2 * time.Minute)
	for {
		if resp, err := http.Get(a.base + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return a
			}
		}
		if !a.running() {
			t.Fatalf("playwatch run exited during start-up: %v\n%s", a.err, fileTail(logPath, 30))
		}
		if time.Now().After(deadline) {
			t.Fatalf("playwatch run not ready after 2 minutes\n%s", fileTail(logPath, 30))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (a *appliance) running() bool { return !isClosed(a.exited) }

// stop sends sig and waits for the process to exit; it returns the exit status.
func (a *appliance) stop(t *testing.T, sig syscall.Signal, timeout time.Duration) error {
	t.Helper()
	if a.running() {
		if err := a.cmd.Process.Signal(sig); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-a.exited:
		return a.err
	case <-time.After(timeout):
		t.Fatalf("playwatch run did not exit within %s of %v", timeout, sig)
		return nil
	}
}

// metric scrapes the appliance's /metrics (see scrapeMetric).
func (a *appliance) metric(t *testing.T, name, labels string) float64 {
	t.Helper()
	return scrapeMetric(t, a.base, name, labels)
}

// applianceEnv is the environment of an appliance on dataDir that listens
// on free ports, with extra set on top.
func applianceEnv(t *testing.T, dataDir string, extra map[string]string) map[string]string {
	env := map[string]string{
		"PLAYWATCH_DATA_DIR":    dataDir,
		"PLAYWATCH_HTTP_ADDR":   freeAddr(t),
		"PLAYWATCH_BROKER_ADDR": freeAddr(t),
	}
	maps.Copy(env, extra)
	return env
}

// managedApplianceEnv is applianceEnv for a child appliance that runs its
// own PostgreSQL and broker whatever the test's environment says, unless
// extra sets DATABASE_URL or KAFKA_BROKERS.
func managedApplianceEnv(t *testing.T, dataDir string, extra map[string]string) map[string]string {
	env := applianceEnv(t, dataDir, map[string]string{"DATABASE_URL": "", "KAFKA_BROKERS": ""})
	maps.Copy(env, extra)
	return env
}

// logApplianceOnFailure logs the last lines of the appliance's log at the
// end of t if it failed.
func logApplianceOnFailure(t *testing.T, logPath string, lines int) {
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("playwatch log:\n%s", fileTail(logPath, lines))
		}
	})
}

// isClosed reports whether ch is closed, as a process's exited channel is
// once the process has been reaped.
func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// registerOverHTTP registers pkg through the API of the appliance at base.
func registerOverHTTP(t *testing.T, base, pkg string) {
	t.Helper()
	if code, body := httpDo(t, "POST", base+"/api/v1/apps", fmt.Sprintf(`{"package_name":%q}`, pkg)); code != http.StatusCreated {
		t.Fatalf("register %s: %d %s", pkg, code, body)
	}
}
