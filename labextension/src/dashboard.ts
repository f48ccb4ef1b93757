/**
 * A cluster's dashboard pane in the main area: per-GPU utilisation, memory and power across every node (lines
 * for up to eight GPUs, a GPUs x time heatmap beyond), CPU, memory and network of the hosts, and cost over time.
 * It asks the server for the cluster's series once a second while it is shown; the latest values are written as
 * text too (`[data-metric][data-gpu]`, `[data-metric][data-host]`, `[data-metric="spent_usd"]`), which is what a
 * person reads first and what the browser tests read.
 */
import { Widget } from '@lumino/widgets';

import { IGpuSeries, IHostSeries, ISeries, RequestError, Values, fetchSeries } from './api';
import { Heatmap, ILine, LineChart, formatNumber } from './charts';
import { ClusterModel, POLL_MS } from './model';
import { gpuIcon } from './icons';

/** Up to this many GPUs are drawn as lines; more as a heatmap. */
export const MAX_LINES = 8;
const GONE_POLL_MS = 5000;

function last(values: Values | undefined): number | null {
  if (!values) {
    return null;
  }
  for (let i = values.length - 1; i >= 0; i--) {
    const v = values[i];
    if (typeof v === 'number' && isFinite(v)) {
      return v;
    }
  }
  return null;
}

function fmt(v: number | null, digits: number, unit = ''): string {
  return v === null ? '-' : `${v.toFixed(digits)}${unit}`;
}

function el<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  className: string,
  text?: string
): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  node.className = className;
  if (text !== undefined) {
    node.textContent = text;
  }
  return node;
}

/** A cell of a latest-values table, addressable as `[data-metric=..][data-gpu|data-host=..]`. */
function valueCell(metric: string, key: 'gpu' | 'host', label: string, text: string, raw: number | null) {
  const td = el('td', 'gnb-value', text);
  td.dataset.metric = metric;
  td.dataset[key] = label;
  if (raw !== null) {
    td.dataset.value = String(raw);
  }
  return td;
}

function table(head: string[], rows: HTMLTableRowElement[]): HTMLTableElement {
  const t = el('table', 'gnb-latest');
  const tr = document.createElement('tr');
  for (const h of head) {
    tr.append(el('th', '', h));
  }
  t.append(tr, ...rows);
  return t;
}

export class DashboardPane extends Widget {
  private _timer: number | null = null;
  private _inFlight = false;
  private _gone = false;
  private _status: HTMLDivElement;
  private _summary: HTMLDivElement;
  private _gpuSection: HTMLElement;
  private _hostSection: HTMLElement;
  private _costSection: HTMLElement;
  private _gpuCharts: { util: LineChart; mem: LineChart; power: LineChart } | null = null;
  private _heat: { util: Heatmap; mem: Heatmap } | null = null;
  private _hostCharts: { cpu: LineChart; mem: LineChart; net: LineChart } | null = null;
  private _cost: { spent: LineChart; rate: LineChart } | null = null;
  private _updates = 0;

  constructor(
    private _model: ClusterModel,
    readonly clusterId: string,
    readonly clusterName: string
  ) {
    super();
    this.addClass('gnb-dashboard');
    this.id = `gpu-notebook-dashboard-${clusterId.replace(/[^A-Za-z0-9_-]/g, '_')}`;
    this.title.label = `GPU: ${clusterName}`;
    this.title.caption = `gpu_notebook dashboard of cluster ${clusterName}`;
    this.title.icon = gpuIcon;
    this.title.closable = true;
    this.node.dataset.id = clusterId;
    const header = el('div', 'gnb-dash-header');
    header.append(el('h2', 'gnb-dash-name', clusterName));
    this._summary = el('div', 'gnb-dash-summary');
    header.append(this._summary);
    this._status = el('div', 'gnb-dash-status', 'loading...');
    this._gpuSection = el('section', 'gnb-dash-gpus');
    this._hostSection = el('section', 'gnb-dash-hosts');
    this._costSection = el('section', 'gnb-dash-cost');
    this.node.append(header, this._status, this._gpuSection, this._hostSection, this._costSection);
    this._model.changed.connect(this._renderSummary, this);
  }

  /** Whether the server last said the cluster is gone (404). */
  get gone(): boolean {
    return this._gone;
  }

  dispose(): void {
    this._stop();
    this._model.changed.disconnect(this._renderSummary, this);
    super.dispose();
  }

  protected onAfterAttach(): void {
    this._start();
  }

  protected onBeforeDetach(): void {
    this._stop();
  }

  protected onAfterShow(): void {
    this._start();
  }

  protected onBeforeHide(): void {
    this._stop();
  }

  private _start(): void {
    if (this._timer === null && !this.isDisposed) {
      this._timer = window.setTimeout(() => void this._tick(), 0);
    }
  }

  private _stop(): void {
    if (this._timer !== null) {
      window.clearTimeout(this._timer);
      this._timer = null;
    }
  }

  private async _tick(): Promise<void> {
    if (!this._inFlight) {
      this._inFlight = true;
      try {
        const series = await fetchSeries(this.clusterId);
        this._gone = false;
        this._render(series);
      } catch (error) {
        this._fail(error);
      } finally {
        this._inFlight = false;
      }
    }
    if (this._timer !== null && !this.isDisposed) {
      this._timer = window.setTimeout(() => void this._tick(), this._gone ? GONE_POLL_MS : POLL_MS);
    }
  }

  private _fail(error: unknown): void {
    if (error instanceof RequestError && error.status === 404) {
      this._gone = true;
      this.addClass('gnb-is-gone');
      this._status.className = 'gnb-dash-status gnb-gone';
      this._status.textContent = `Cluster ${this.clusterName} is gone: it was stopped or its kernel ended.`;
      this.title.label = `GPU: ${this.clusterName} (gone)`;
      return;
    }
    this._status.className = 'gnb-dash-status gnb-error';
    this._status.textContent = `No update: ${error instanceof Error ? error.message : String(error)}`;
  }

  private _renderSummary(): void {
    const e = this._model.find(this.clusterId);
    if (!e) {
      this._summary.textContent = '';
      if (this._model.loaded && !this._model.error) {
        // gone from the server's list: say so now, also while this pane is hidden and not polling
        this._fail(new RequestError(404, 'not listed'));
      }
      return;
    }
    const parts = [
      e.kind + (e.cloud ? ` (${e.cloud})` : ''),
      e.state,
      `${e.nodes ?? '-'} nodes`,
      `${e.gpus ?? 0} GPUs`,
      e.usd_per_hour !== null && e.usd_per_hour !== undefined ? `$${e.usd_per_hour.toFixed(2)}/h` : '',
      e.notebook ? `owner: ${e.notebook}` : ''
    ];
    this._summary.textContent = parts.filter(Boolean).join(' · ');
  }

  private _render(s: ISeries): void {
    this._updates += 1;
    this.removeClass('gnb-is-gone');
    this.title.label = `GPU: ${this.clusterName}`;
    this._status.className = 'gnb-dash-status';
    const t = Array.isArray(s?.t) ? s.t : [];
    const stamp = t.length ? new Date(t[t.length - 1] * 1000).toLocaleTimeString() : '-';
    this._status.textContent = `${t.length} samples, latest at ${stamp}`;
    this._status.dataset.updates = String(this._updates);
    this._renderGpus(t, s?.gpus ?? []);
    this._renderHosts(t, s?.hosts ?? []);
    this._renderCost(s?.cost);
  }

  private _renderGpus(t: number[], gpus: IGpuSeries[]): void {
    const sec = this._gpuSection;
    if (gpus.length === 0) {
      sec.replaceChildren(el('h3', '', 'GPUs'), el('p', 'gnb-empty', 'No GPU on this cluster (or none sampled yet).'));
      this._gpuCharts = null;
      this._heat = null;
      return;
    }
    const lines = (key: 'util_gpu' | 'mem_used_mib' | 'power_w'): ILine[] =>
      gpus.map(g => ({ label: g.label, values: g[key] ?? [] }));
    let charts: HTMLElement[];
    if (gpus.length <= MAX_LINES) {
      this._heat = null;
      if (!this._gpuCharts) {
        this._gpuCharts = {
          util: new LineChart({ title: 'GPU utilisation', unit: '%', yMax: 100 }),
          mem: new LineChart({ title: 'GPU memory used', unit: ' MiB' }),
          power: new LineChart({ title: 'GPU power', unit: ' W', waiting: 'no power readings' })
        };
      }
      this._gpuCharts.util.update(t, lines('util_gpu'));
      this._gpuCharts.mem.update(t, lines('mem_used_mib'));
      this._gpuCharts.power.update(t, lines('power_w'));
      charts = [this._gpuCharts.util.node, this._gpuCharts.mem.node, this._gpuCharts.power.node];
    } else {
      this._gpuCharts = null;
      if (!this._heat) {
        this._heat = { util: new Heatmap('GPU utilisation (%)'), mem: new Heatmap('GPU memory used (% of total)') };
      }
      this._heat.util.update(lines('util_gpu'));
      this._heat.mem.update(
        gpus.map(g => ({
          label: g.label,
          values: (g.mem_used_mib ?? []).map(v =>
            typeof v === 'number' && g.mem_total_mib ? (100 * v) / g.mem_total_mib : null
          )
        }))
      );
      charts = [this._heat.util.node, this._heat.mem.node];
    }
    const rows = gpus.map(g => {
      const tr = document.createElement('tr');
      tr.className = 'gnb-gpu';
      tr.dataset.gpu = g.label;
      const util = last(g.util_gpu);
      const mem = last(g.mem_used_mib);
      const power = last(g.power_w);
      const total = g.mem_total_mib ? ` / ${formatNumber(g.mem_total_mib)}` : '';
      tr.append(
        el('td', 'gnb-label', g.label),
        valueCell('util_gpu', 'gpu', g.label, fmt(util, 0, '%'), util),
        valueCell('mem_used_mib', 'gpu', g.label, `${fmt(mem, 0)}${total} MiB`, mem),
        valueCell('power_w', 'gpu', g.label, fmt(power, 0, ' W'), power)
      );
      return tr;
    });
    const grid = el('div', 'gnb-charts');
    grid.append(...charts);
    sec.replaceChildren(
      el('h3', '', `GPUs (${gpus.length})`),
      grid,
      table(['GPU', 'utilisation', 'memory', 'power'], rows)
    );
  }

  private _renderHosts(t: number[], hosts: IHostSeries[]): void {
    const sec = this._hostSection;
    if (hosts.length === 0) {
      sec.replaceChildren();
      this._hostCharts = null;
      return;
    }
    if (!this._hostCharts) {
      this._hostCharts = {
        cpu: new LineChart({ title: 'Host CPU', unit: '%', yMax: 100 }),
        mem: new LineChart({ title: 'Host memory used', unit: ' MiB' }),
        net: new LineChart({ title: 'Host network (rx + tx)', unit: ' B/s' })
      };
    }
    const lines = (key: 'cpu_percent' | 'mem_used_mib'): ILine[] =>
      hosts.map(h => ({ label: h.label, values: h[key] ?? [] }));
    this._hostCharts.cpu.update(t, lines('cpu_percent'));
    this._hostCharts.mem.update(t, lines('mem_used_mib'));
    this._hostCharts.net.update(
      t,
      hosts.map(h => ({
        label: h.label,
        values: (h.net_rx_Bps ?? []).map((rx, i) => {
          const tx = (h.net_tx_Bps ?? [])[i];
          return typeof rx === 'number' || typeof tx === 'number' ? (rx ?? 0) + (tx ?? 0) : null;
        })
      }))
    );
    const rows = hosts.map(h => {
      const tr = document.createElement('tr');
      tr.className = 'gnb-host';
      tr.dataset.host = h.label;
      const cpu = last(h.cpu_percent);
      const mem = last(h.mem_used_mib);
      const rx = last(h.net_rx_Bps);
      const tx = last(h.net_tx_Bps);
      tr.append(
        el('td', 'gnb-label', h.label),
        valueCell('cpu_percent', 'host', h.label, fmt(cpu, 0, '%'), cpu),
        valueCell('mem_used_mib', 'host', h.label, fmt(mem, 0, ' MiB'), mem),
        valueCell('net_rx_Bps', 'host', h.label, rx === null ? '-' : `${formatNumber(rx)} B/s`, rx),
        valueCell('net_tx_Bps', 'host', h.label, tx === null ? '-' : `${formatNumber(tx)} B/s`, tx)
      );
      return tr;
    });
    const grid = el('div', 'gnb-charts');
    grid.append(this._hostCharts.cpu.node, this._hostCharts.mem.node, this._hostCharts.net.node);
    sec.replaceChildren(
      el('h3', '', `Hosts (${hosts.length})`),
      grid,
      table(['host', 'CPU', 'memory', 'net rx', 'net tx'], rows)
    );
  }

  private _renderCost(cost: ISeries['cost'] | undefined): void {
    const sec = this._costSection;
    if (!this._cost) {
      this._cost = {
        spent: new LineChart({ title: 'Spent', unit: ' $', waiting: 'no cost samples yet' }),
        rate: new LineChart({ title: 'Price', unit: ' $/h', waiting: 'no cost samples yet' })
      };
    }
    const t = cost?.t ?? [];
    this._cost.spent.update(t, [{ label: 'spent (USD)', values: cost?.spent_usd ?? [] }]);
    this._cost.rate.update(t, [{ label: 'USD per hour', values: cost?.usd_per_hour ?? [] }]);
    const spent = last(cost?.spent_usd);
    const rate = last(cost?.usd_per_hour);
    const text = el('p', 'gnb-cost-latest');
    const s = el('span', 'gnb-value', spent === null ? '-' : `$${spent.toFixed(2)} spent`);
    s.dataset.metric = 'spent_usd';
    const r = el('span', 'gnb-value', rate === null ? '-' : `$${rate.toFixed(2)}/h`);
    r.dataset.metric = 'usd_per_hour';
    text.append(s, document.createTextNode(' · '), r);
    const grid = el('div', 'gnb-charts');
    grid.append(this._cost.spent.node, this._cost.rate.node);
    sec.replaceChildren(el('h3', '', 'Cost'), grid, text);
  }
}
