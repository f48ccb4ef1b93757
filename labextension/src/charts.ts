/**
 * Charts drawn as inline SVG: a line chart for a few series and a heatmap (rows x time) for many. No chart
 * library: each redraw replaces one SVG's children, which for a minute of one-second samples is a few hundred
 * nodes; a chart with no data says what it waits for.
 */
import { Values } from './api';

const SVG = 'http://www.w3.org/2000/svg';

/** Colours of the lines, in order (readable on the light and the dark theme). */
export const PALETTE = [
  '#1f77b4',
  '#ff7f0e',
  '#2ca02c',
  '#d62728',
  '#9467bd',
  '#8c564b',
  '#e377c2',
  '#17becf'
];

function svgEl<K extends keyof SVGElementTagNameMap>(
  tag: K,
  attrs: Record<string, string | number>
): SVGElementTagNameMap[K] {
  const el = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) {
    el.setAttribute(k, String(v));
  }
  return el;
}

export interface ILine {
  label: string;
  values: Values;
  color?: string;
}

export interface IChartOptions {
  /** The chart's title (also its `data-chart` attribute). */
  title: string;
  /** The unit shown after the axis values. */
  unit: string;
  /** A fixed top of the y axis (100 for percentages); otherwise the data's maximum. */
  yMax?: number;
  /** What an empty chart says. */
  waiting?: string;
  /** How values are written on the axis. */
  format?: (v: number) => string;
}

const W = 320;
const H = 120;
const PAD = { left: 50, right: 8, top: 8, bottom: 16 };

function finite(values: Values): number[] {
  return values.filter((v): v is number => typeof v === 'number' && isFinite(v));
}

export function formatNumber(v: number): string {
  const a = Math.abs(v);
  if (a >= 1e9) {
    return (v / 1e9).toFixed(1) + 'G';
  }
  if (a >= 1e6) {
    return (v / 1e6).toFixed(1) + 'M';
  }
  if (a >= 1e4) {
    return (v / 1e3).toFixed(0) + 'k';
  }
  if (a >= 100 || v === 0) {
    return v.toFixed(0);
  }
  return v.toFixed(a >= 10 ? 1 : 2);
}

/** A chart box: a title, an SVG and a legend; `update` redraws it. */
export class LineChart {
  readonly node: HTMLDivElement;
  private _svg: SVGSVGElement;
  private _legend: HTMLDivElement;

  constructor(private _options: IChartOptions) {
    this.node = document.createElement('div');
    this.node.className = 'gnb-chart';
    this.node.dataset.chart = _options.title;
    const title = document.createElement('div');
    title.className = 'gnb-chart-title';
    title.textContent = _options.title;
    this._svg = svgEl('svg', { viewBox: `0 0 ${W} ${H}`, class: 'gnb-svg' });
    this._legend = document.createElement('div');
    this._legend.className = 'gnb-legend';
    this.node.append(title, this._svg, this._legend);
  }

  update(t: number[], lines: ILine[]): void {
    const svg = this._svg;
    svg.replaceChildren();
    const all = lines.flatMap(l => finite(l.values));
    const fmt = this._options.format ?? formatNumber;
    if (t.length < 2 || all.length === 0) {
      const text = svgEl('text', { x: W / 2, y: H / 2, 'text-anchor': 'middle', class: 'gnb-waiting' });
      text.textContent = this._options.waiting ?? 'waiting for samples...';
      svg.append(text);
      this._legend.replaceChildren();
      return;
    }
    const yMax = this._options.yMax ?? (Math.max(...all) * 1.1 || 1);
    const t0 = t[0];
    const span = t[t.length - 1] - t0 || 1;
    const x = (ti: number) => PAD.left + ((ti - t0) / span) * (W - PAD.left - PAD.right);
    const y = (v: number) => H - PAD.bottom - (Math.min(v, yMax) / yMax) * (H - PAD.top - PAD.bottom);
    // the frame and the y axis' two values
    svg.append(
      svgEl('rect', {
        x: PAD.left,
        y: PAD.top,
        width: W - PAD.left - PAD.right,
        height: H - PAD.top - PAD.bottom,
        class: 'gnb-frame'
      })
    );
    for (const [v, yy] of [
      [yMax, PAD.top + 8],
      [0, H - PAD.bottom]
    ]) {
      const label = svgEl('text', { x: PAD.left - 4, y: yy, 'text-anchor': 'end', class: 'gnb-axis' });
      label.textContent = `${fmt(v)}${this._options.unit}`;
      svg.append(label);
    }
    const seconds = svgEl('text', { x: W - PAD.right, y: H - 3, 'text-anchor': 'end', class: 'gnb-axis' });
    seconds.textContent = `last ${Math.round(span)} s`;
    svg.append(seconds);
    const legend: HTMLElement[] = [];
    lines.forEach((line, i) => {
      const color = line.color ?? PALETTE[i % PALETTE.length];
      let d = '';
      let pen = false;
      const n = Math.min(t.length, line.values.length);
      for (let k = 0; k < n; k++) {
        const v = line.values[k];
        if (typeof v !== 'number' || !isFinite(v)) {
          pen = false; // a gap where samples are missing
          continue;
        }
        d += `${pen ? 'L' : 'M'}${x(t[k]).toFixed(1)},${y(v).toFixed(1)}`;
        pen = true;
      }
      if (d) {
        svg.append(
          svgEl('path', {
            d,
            fill: 'none',
            stroke: color,
            'stroke-width': 1.5,
            'vector-effect': 'non-scaling-stroke',
            'data-label': line.label
          })
        );
      }
      const item = document.createElement('span');
      item.className = 'gnb-legend-item';
      item.style.setProperty('--gnb-line', color);
      item.textContent = line.label;
      legend.push(item);
    });
    this._legend.replaceChildren(...legend);
  }
}

/** Rows x time, each cell coloured by its value between 0 and `max` (many GPUs' utilisation at a glance); the
 * rows' labels in a column beside it, the values as tooltips. */
export class Heatmap {
  readonly node: HTMLDivElement;
  private _labels: HTMLDivElement;
  private _svg: SVGSVGElement;

  constructor(
    title: string,
    private _max = 100,
    private _columns = 60
  ) {
    this.node = document.createElement('div');
    this.node.className = 'gnb-chart gnb-heatmap';
    this.node.dataset.chart = title;
    const head = document.createElement('div');
    head.className = 'gnb-chart-title';
    head.textContent = title;
    const body = document.createElement('div');
    body.className = 'gnb-heatmap-body';
    this._labels = document.createElement('div');
    this._labels.className = 'gnb-heatmap-labels';
    this._svg = svgEl('svg', { preserveAspectRatio: 'none', class: 'gnb-heatmap-svg' });
    body.append(this._labels, this._svg);
    this.node.append(head, body);
  }

  update(rows: ILine[]): void {
    const svg = this._svg;
    svg.replaceChildren();
    const cols = Math.min(this._columns, Math.max(0, ...rows.map(r => r.values.length)));
    const rowPx = rows.length <= 32 ? 12 : 6;
    this.node.style.setProperty('--gnb-row', `${rowPx}px`);
    svg.setAttribute('viewBox', `0 0 ${Math.max(cols, 1)} ${Math.max(rows.length, 1)}`);
    svg.style.height = `${Math.max(rows.length, 1) * rowPx}px`;
    this._labels.replaceChildren(
      ...rows.map(r => {
        const label = document.createElement('div');
        label.textContent = r.label;
        return label;
      })
    );
    if (cols === 0) {
      return;
    }
    rows.forEach((row, r) => {
      const values = row.values.slice(-cols);
      const offset = cols - values.length;
      values.forEach((v, c) => {
        const rect = svgEl('rect', { x: offset + c, y: r, width: 1.05, height: 1 });
        if (typeof v === 'number' && isFinite(v)) {
          const f = Math.max(0, Math.min(1, v / this._max));
          // dark blue (idle) to yellow (busy)
          rect.setAttribute('fill', `hsl(${230 - f * 170}, 80%, ${25 + f * 35}%)`);
        } else {
          rect.setAttribute('class', 'gnb-missing');
        }
        const tip = svgEl('title', {});
        tip.textContent = `${row.label}: ${typeof v === 'number' ? v.toFixed(0) : '-'}`;
        rect.append(tip);
        svg.append(rect);
      });
    });
  }
}
