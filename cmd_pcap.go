package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"time"
)

// networkMetricsPublisher sends one analysis; nil means a dry run.
type networkMetricsPublisher interface {
	PublishNetworkMetrics(ctx context.Context, m networkMetricsMessage) error
}

// pcapJob says what the captures of one `playwatch pcap` run are.
type pcapJob struct {
	Package  string
	Scenario string // UPLOAD or DOWNLOAD
}

// pcapScenario is --scenario in its canonical case (UPLOAD or DOWNLOAD,
// as stored), given in any case; false for anything else.
func pcapScenario(s string) (string, bool) {
	u := strings.ToUpper(s)
	return u, u == "UPLOAD" || u == "DOWNLOAD"
}

// progressEvery is how often a long analysis reports on stderr.
const progressEvery = 2 * time.Second

// analyzeCaptures is the body of `playwatch pcap`: each file becomes one
// network-metrics message with a fresh analysis_id. A dry run prints the
// messages as JSON lines; otherwise they are published and a summary line
// per file is printed. A file that fails does not stop the others.
func analyzeCaptures(ctx context.Context, files []string, job pcapJob, pub networkMetricsPublisher, stdout, stderr io.Writer) error {
	return analyzeCapturesWith(ctx, analyzePcapFile, files, job, pub, stdout, stderr)
}

// pcapFileAnalyzer analyses one capture file (analyzePcapFile).
type pcapFileAnalyzer func(ctx context.Context, path string, progress func(bytesRead, size int64)) (pcapResult, error)

// analyzeCapturesWith is analyzeCaptures with the analyzer given.
func analyzeCapturesWith(ctx context.Context, analyze pcapFileAnalyzer, files []string, job pcapJob, pub networkMetricsPublisher, stdout, stderr io.Writer) error {
	enc := json.NewEncoder(stdout)
	enc.SetEscapeHTML(false)
	var failed []string
	for _, path := range files {
		msg, err := analyzeCapture(ctx, analyze, path, job, stderr)
		if err == nil && msg.OverheadRatio == nil {
			err = fmt.Errorf("%s: the capture holds no records, so there is nothing to measure", path)
		}
		switch {
		case err != nil:
		case pub == nil:
			err = enc.Encode(msg)
		default:
			if err = pub.PublishNetworkMetrics(ctx, msg); err == nil {
				fmt.Fprintf(stdout, "%s: published analysis %s (%s %s: %d bytes, %d retransmissions, %d out of order, %d resets)\n",
					path, msg.AnalysisID, job.Package, job.Scenario, msg.BytesTransferredTotal,
					msg.RetransmissionCount, msg.OutOfOrderCount, msg.TCPResetCount)
			}
		}
		if err != nil {
			fmt.Fprintf(stderr, "playwatch pcap: %v\n", err)
			failed = append(failed, path)
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
	if len(failed) > 0 {
		return fmt.Errorf("%d of %d captures failed: %v", len(failed), len(files), failed)
	}
	return nil
}

// analyzeCapture analyses one file. A panic of the analyzer, which a
// crafted or damaged capture may set off, is that file's error: the other
// files go on.
func analyzeCapture(ctx context.Context, analyze pcapFileAnalyzer, path string, job pcapJob, stderr io.Writer) (msg networkMetricsMessage, err error) {
	defer func() {
		if p := recover(); p != nil {
			msg, err = networkMetricsMessage{}, fmt.Errorf("%s: the analyzer failed on this capture (a playwatch bug: please report it with the file): %w", path, recoveredPanic(p))
		}
	}()
	start := time.Now()
	next := start.Add(progressEvery)
	res, err := analyze(ctx, path, func(read, size int64) {
		if now := time.Now(); now.After(next) {
			next = now.Add(progressEvery)
			fmt.Fprintf(stderr, "%s: %.0f%% (%d of %d MB) after %s\n", path, 100*float64(read)/float64(max(size, 1)),
				read>>20, size>>20, now.Sub(start).Round(time.Second))
		}
	})
	if err != nil {
		return networkMetricsMessage{}, err
	}
	for _, w := range res.Warnings {
		fmt.Fprintf(stderr, "playwatch pcap: warning: %v\n", w)
	}
	msg = networkMetricsMessage{
		AnalysisID:         newUUIDv4(),
		PackageName:        job.Package,
		Scenario:           job.Scenario,
		SourcePcapFilename: filepath.Base(path),
		AnalyzedAt:         messageTime(time.Now()),
	}
	res.fillNetworkMetrics(&msg)
	return msg, nil
}

func cmdPcap(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	var job pcapJob
	var dryRun bool
	cl, err := parseCommandLine("pcap", "pcap --app PACKAGE --scenario UPLOAD|DOWNLOAD [--dry-run] FILE...", args, getenv, stdout, stderr, func(fs *flag.FlagSet) {
		fs.StringVar(&job.Package, "app", "", "package name of the app the captures belong to (must be registered unless --dry-run)")
		fs.StringVar(&job.Scenario, "scenario", "", "UPLOAD or DOWNLOAD")
		fs.BoolVar(&dryRun, "dry-run", false, "print the messages as JSON lines instead of publishing them")
	})
	if err != nil {
		return err
	}
	if err := validatePackageName(job.Package); err != nil {
		return usageError{"--app: " + err.Error()}
	}
	scenario, ok := pcapScenario(job.Scenario)
	if !ok {
		return usageError{fmt.Sprintf("--scenario must be UPLOAD or DOWNLOAD, not %q", job.Scenario)}
	}
	job.Scenario = scenario
	if len(cl.args) == 0 {
		return usageError{"pcap needs at least one capture file"}
	}
	if dryRun {
		return analyzeCaptures(ctx, cl.args, job, nil, stdout, stderr)
	}
	return cl.attach(ctx, backendOptions{broker: true}, func(be *backends) error {
		if _, err := newAppStore(be.pool).Get(ctx, job.Package); errors.Is(err, errAppNotFound) {
			return fmt.Errorf("%s is not registered: register it first (POST /api/v1/apps) or use --dry-run", job.Package)
		} else if err != nil {
			return err
		}
		pub, err := cl.publisher(be)
		if err != nil {
			return err
		}
		return analyzeCaptures(ctx, cl.args, job, pub, stdout, stderr)
	})
}
