// Export logs, spans or metric points with the OpenTelemetry JavaScript SDK and its OTLP
// exporters, the way a Node service does, and print one JSON line saying what was exported and
// what the exporter answered. tests/otel_js_support.py runs it against a real ingestor (issue 41).
//
//   node export.mjs --endpoint http://127.0.0.1:4318 --protocol http/protobuf --signal logs \
//        --token SECRET --count 10 --service checkout [--compression gzip] [--timeout-ms 10000]
//
// --endpoint is the base URL (OTEL_EXPORTER_OTLP_ENDPOINT's meaning): the HTTP exporters post to
// <endpoint>/v1/<signal>, the gRPC exporters connect to it. The token is sent as
// `Authorization: Bearer <token>` (an HTTP header, or gRPC metadata). The output line:
//   {"signal", "protocol", "service", "endpoint", "items", "exports", "ok", "results":
//    [{"code": "SUCCESS"|"FAILED", "items": n, "error": null|"..."}], "warnings": [...],
//    "flush_error": null|"...", ...signal details (trace_id, span_ids, points)}
// "items" counts log records, spans or metric data points handed to the exporter; "ok" is true
// when every export call answered SUCCESS. Partial success (rejected records) is a SUCCESS with
// the SDK's diagnostic warning, kept in "warnings".
import { parseArgs } from 'node:util';
import { randomBytes } from 'node:crypto';

import { Metadata } from '@grpc/grpc-js';
import { DiagLogLevel, ROOT_CONTEXT, TraceFlags, diag, trace } from '@opentelemetry/api';
import { SeverityNumber } from '@opentelemetry/api-logs';
import { ExportResultCode } from '@opentelemetry/core';
import { resourceFromAttributes } from '@opentelemetry/resources';
import { BatchLogRecordProcessor, LoggerProvider } from '@opentelemetry/sdk-logs';
import {
  AggregationType,
  MeterProvider,
  PeriodicExportingMetricReader,
} from '@opentelemetry/sdk-metrics';
import { BasicTracerProvider, BatchSpanProcessor } from '@opentelemetry/sdk-trace-base';

const PROTOCOLS = ['http/json', 'http/protobuf', 'grpc'];
const SIGNALS = ['logs', 'traces', 'metrics'];
// exporter module by protocol: the three packages of each signal are the ones a service picks
// between with OTEL_EXPORTER_OTLP_PROTOCOL
const MODULES = {
  logs: {
    'http/json': '@opentelemetry/exporter-logs-otlp-http',
    'http/protobuf': '@opentelemetry/exporter-logs-otlp-proto',
    grpc: '@opentelemetry/exporter-logs-otlp-grpc',
  },
  traces: {
    'http/json': '@opentelemetry/exporter-trace-otlp-http',
    'http/protobuf': '@opentelemetry/exporter-trace-otlp-proto',
    grpc: '@opentelemetry/exporter-trace-otlp-grpc',
  },
  metrics: {
    'http/json': '@opentelemetry/exporter-metrics-otlp-http',
    'http/protobuf': '@opentelemetry/exporter-metrics-otlp-proto',
    grpc: '@opentelemetry/exporter-metrics-otlp-grpc',
  },
};
const CLASSES = { logs: 'OTLPLogExporter', traces: 'OTLPTraceExporter', metrics: 'OTLPMetricExporter' };

function fail(message) {
  process.stderr.write(`export.mjs: ${message}\n`);
  process.exit(2);
}

function options() {
  const { values } = parseArgs({
    options: {
      endpoint: { type: 'string' },
      protocol: { type: 'string' },
      signal: { type: 'string' },
      token: { type: 'string', default: '' },
      count: { type: 'string', default: '10' },
      service: { type: 'string', default: 'icefloe-js-test' },
      compression: { type: 'string', default: 'none' },
      'timeout-ms': { type: 'string', default: '10000' },
      'batch-size': { type: 'string', default: '512' },
    },
    strict: true,
  });
  if (!values.endpoint) fail('--endpoint is required (e.g. http://127.0.0.1:4318)');
  if (!PROTOCOLS.includes(values.protocol)) fail(`--protocol must be one of ${PROTOCOLS.join(', ')}`);
  if (!SIGNALS.includes(values.signal)) fail(`--signal must be one of ${SIGNALS.join(', ')}`);
  if (!['none', 'gzip'].includes(values.compression)) fail('--compression must be none or gzip');
  const count = Number.parseInt(values.count, 10);
  if (!(count >= 1)) fail(`--count must be a positive integer, not ${values.count}`);
  return {
    ...values,
    count,
    timeoutMs: Number.parseInt(values['timeout-ms'], 10),
    batchSize: Number.parseInt(values['batch-size'], 10),
  };
}

// The exporter's configuration: HTTP exporters take the full URL and headers, gRPC ones the
// server URL and metadata (grpc-js's own Metadata, of the copy the exporter loads).
function exporterConfig(opts) {
  const auth = opts.token ? `Bearer ${opts.token}` : undefined;
  const base = { timeoutMillis: opts.timeoutMs, compression: opts.compression };
  if (opts.protocol === 'grpc') {
    const metadata = new Metadata();
    if (auth) metadata.set('authorization', auth);
    return { ...base, url: opts.endpoint, metadata };
  }
  const url = `${opts.endpoint.replace(/\/+$/, '')}/v1/${opts.signal}`;
  return { ...base, url, headers: auth ? { Authorization: auth } : {} };
}

function countItems(signal, items) {
  if (signal !== 'metrics') return items.length;
  let points = 0;
  for (const scope of items.scopeMetrics) {
    for (const metric of scope.metrics) points += metric.dataPoints.length;
  }
  return points;
}

// Wraps the real exporter to record every export call's result: the processors and readers
// turn a failure into a rejected flush or a diag message, which loses the exporter's own error.
function recording(exporter, signal, results) {
  return new Proxy(exporter, {
    get(target, prop) {
      if (prop === 'export') {
        return (items, done) => {
          const n = countItems(signal, items);
          target.export(items, (result) => {
            results.push({
              code: result.code === ExportResultCode.SUCCESS ? 'SUCCESS' : 'FAILED',
              items: n,
              error: result.error ? String(result.error.message ?? result.error) : null,
            });
            done(result);
          });
        };
      }
      const value = Reflect.get(target, prop);
      return typeof value === 'function' ? value.bind(target) : value;
    },
  });
}

const hex = (bytes) => randomBytes(bytes).toString('hex');

// every attribute value type OTLP carries on spans (string, bool, int, double and arrays of
// each); log records add bytes and nested maps (AnyValue kvlist) below
function attributes(i) {
  return {
    'test.string': `value-${i}`,
    'test.bool': i % 2 === 0,
    'test.int': i,
    'test.double': i + 0.5,
    'test.strings': ['a', `b${i}`],
    'test.ints': [1, 2, i],
    'test.doubles': [0.25, i + 0.75],
    'test.bools': [true, false],
    'http.response.status_code': 200 + (i % 3),
  };
}

async function emitLogs(opts, exporter) {
  const provider = new LoggerProvider({
    resource: resourceFromAttributes({ 'service.name': opts.service }),
    processors: [
      new BatchLogRecordProcessor({
        exporter,
        maxExportBatchSize: opts.batchSize,
        maxQueueSize: Math.max(2048, opts.count),
        scheduledDelayMillis: 60_000,
      }),
    ],
  });
  const logger = provider.getLogger('icefloe.js.test', '1.0.0');
  const traceId = hex(16);
  const spanId = hex(8);
  const context = trace.setSpanContext(ROOT_CONTEXT, { traceId, spanId, traceFlags: TraceFlags.SAMPLED });
  for (let i = 0; i < opts.count; i += 1) {
    const error = i % 5 === 4;
    logger.emit({
      severityNumber: error ? SeverityNumber.ERROR : SeverityNumber.INFO,
      severityText: error ? 'ERROR' : 'INFO',
      body: i % 2 === 0 ? `log record ${i}` : { message: `log record ${i}`, index: i },
      attributes: {
        ...attributes(i),
        'test.bytes': new Uint8Array([0, 1, 2, i % 256]),
        'test.map': { nested: 'yes', depth: 1 },
      },
      context,
      eventName: i === 0 ? 'icefloe.test.first' : undefined,
    });
  }
  return { provider, details: { trace_id: traceId, span_id: spanId } };
}

async function emitSpans(opts, exporter) {
  const provider = new BasicTracerProvider({
    resource: resourceFromAttributes({ 'service.name': opts.service }),
    spanProcessors: [
      new BatchSpanProcessor(exporter, {
        maxExportBatchSize: opts.batchSize,
        maxQueueSize: Math.max(2048, opts.count),
        scheduledDelayMillis: 60_000,
      }),
    ],
  });
  const tracer = provider.getTracer('icefloe.js.test', '1.0.0');
  const root = tracer.startSpan('root', { kind: 1, attributes: attributes(0) });
  const parent = trace.setSpan(ROOT_CONTEXT, root);
  const linked = { traceId: hex(16), spanId: hex(8), traceFlags: TraceFlags.SAMPLED };
  const spanIds = [root.spanContext().spanId];
  for (let i = 1; i < opts.count; i += 1) {
    const span = tracer.startSpan(
      `child-${i}`,
      { kind: i % 5, attributes: attributes(i), links: [{ context: linked, attributes: { 'link.index': i } }] },
      parent,
    );
    span.addEvent('checkpoint', { 'event.index': i, 'event.ok': true });
    if (i % 5 === 4) span.setStatus({ code: 2, message: `failed ${i}` });
    span.end();
    spanIds.push(span.spanContext().spanId);
  }
  root.addEvent('root.event', { 'event.index': 0 });
  root.end();
  const details = { trace_id: root.spanContext().traceId, root_span_id: spanIds[0], span_ids: spanIds };
  return { provider, details };
}

async function emitMetrics(opts, exporter) {
  // one point per attribute set: room for them all (the SDK's default is 2000 per metric,
  // from the reader for instruments without a view, from the view for the others)
  const limit = Math.max(2000, opts.count + 1);
  const reader = new PeriodicExportingMetricReader({
    exporter,
    exportIntervalMillis: 3_600_000,
    exportTimeoutMillis: opts.timeoutMs,
    cardinalityLimits: { default: limit },
  });
  const provider = new MeterProvider({
    resource: resourceFromAttributes({ 'service.name': opts.service }),
    readers: [reader],
    views: [
      {
        instrumentName: 'icefloe.test.latency_exp',
        aggregation: { type: AggregationType.EXPONENTIAL_HISTOGRAM },
        aggregationCardinalityLimit: limit,
      },
    ],
  });
  const meter = provider.getMeter('icefloe.js.test', '1.0.0');
  const counter = meter.createCounter('icefloe.test.requests', { unit: '{request}' });
  const upDown = meter.createUpDownCounter('icefloe.test.inflight', { unit: '{request}' });
  const gauge = meter.createGauge('icefloe.test.temperature', { unit: 'Cel' });
  const histogram = meter.createHistogram('icefloe.test.latency', { unit: 'ms' });
  const expHistogram = meter.createHistogram('icefloe.test.latency_exp', { unit: 'ms' });
  for (let i = 0; i < opts.count; i += 1) {
    const attrs = { 'point.index': i, 'test.string': `value-${i}` };
    counter.add(i + 1, attrs);
    upDown.add(i % 2 === 0 ? 3 : -1, attrs);
    gauge.record(20 + i / 10, attrs);
    histogram.record(i * 1.5, attrs);
    expHistogram.record(i * 2.5 + 1, attrs);
  }
  const points = { sum: 2 * opts.count, gauge: opts.count, histogram: opts.count, exponential_histogram: opts.count };
  return { provider, details: { points } };
}

const EMITTERS = { logs: emitLogs, traces: emitSpans, metrics: emitMetrics };

async function main() {
  const opts = options();
  const warnings = [];
  const keep = (level) => (message, ...args) => warnings.push(`${level}: ${[message, ...args].map(String).join(' ')}`);
  diag.setLogger(
    { error: keep('error'), warn: keep('warn'), info: () => {}, debug: () => {}, verbose: () => {} },
    DiagLogLevel.WARN,
  );
  const module = await import(MODULES[opts.signal][opts.protocol]);
  const results = [];
  const exporter = recording(new module[CLASSES[opts.signal]](exporterConfig(opts)), opts.signal, results);
  const { provider, details } = await EMITTERS[opts.signal](opts, exporter);
  let flushError = null;
  try {
    await provider.forceFlush();
  } catch (err) {
    flushError = String(err?.message ?? err);
  }
  // no shutdown: a metric reader's shutdown exports the cumulative points a second time; the
  // process exits instead (the gRPC channel would otherwise keep it alive)
  const items = results.reduce((n, r) => n + r.items, 0);
  const line = {
    signal: opts.signal,
    protocol: opts.protocol,
    service: opts.service,
    endpoint: opts.endpoint,
    items,
    exports: results.length,
    ok: results.length > 0 && results.every((r) => r.code === 'SUCCESS') && flushError === null,
    results,
    warnings,
    flush_error: flushError,
    ...details,
  };
  process.stdout.write(`${JSON.stringify(line)}\n`, () => process.exit(0));
}

main().catch((err) => {
  process.stderr.write(`export.mjs: ${err?.stack ?? err}\n`);
  process.exit(1);
});
