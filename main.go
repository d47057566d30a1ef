// Command playwatch watches Google Play apps: a registry of apps, an hourly
// crawler, a Kafka pipeline into PostgreSQL and a pcap analyzer, in one binary.
package main

func main() {}
