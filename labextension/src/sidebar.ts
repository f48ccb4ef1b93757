/**
 * The "GPU clusters" sidebar: every cluster of every kernel of this server, one row each, with what it costs and
 * the buttons to act on it. Rows are keyed by the entry's `id` and updated in place on every poll (a row rebuilt
 * under the pointer would swallow the click); an orphan (a cloud cluster whose kernel is gone) shows the reaper's
 * state and a "tear down now" button instead.
 *
 * Test hooks: `.gnb-cluster-row[data-id]`, its `[data-field=...]` cells, the buttons' classes (`.gnb-dashboard-btn`,
 * `.gnb-ray-dashboard`, `.gnb-stop`, `.gnb-scale`, `.gnb-open-notebook`, `.gnb-use`, `.gnb-teardown`) and the
 * sidebar's `.gnb-message` (the last action's reply).
 */
import { Dialog, InputDialog, Notification, showDialog } from '@jupyterlab/apputils';
import { PageConfig, URLExt } from '@jupyterlab/coreutils';
import { Widget } from '@lumino/widgets';

import { IEntry, IReply, act } from './api';
import { gpuIcon } from './icons';
import { ClusterModel } from './model';

/** What the sidebar needs from the application (kept small so Lab and Notebook 7 both provide it). */
export interface ISidebarActions {
  openDashboard(entry: IEntry): void;
  openNotebook(path: string): void;
  /** Insert `code` below the active cell of the current notebook; false when there is no notebook. */
  useInCurrentNotebook(code: string): boolean;
  hasCurrentNotebook(): boolean;
}

export function money(v: number | null | undefined, suffix = ''): string {
  return typeof v === 'number' && isFinite(v) ? `$${v.toFixed(2)}${suffix}` : '-';
}

export function countdown(seconds: number | null | undefined): string {
  if (typeof seconds !== 'number' || !isFinite(seconds)) {
    return 'off';
  }
  const s = Math.max(0, Math.round(seconds));
  const h = Math.floor(s / 3600);
  const m = Math.floor((s % 3600) / 60);
  const ss = String(s % 60).padStart(2, '0');
  return h ? `${h}h${String(m).padStart(2, '0')}m` : `${m}:${ss}`;
}

/** The Ray dashboard's address: through the server's proxy (works behind JupyterHub) when there is one. */
export function rayDashboardHref(e: IEntry): string | null {
  if (e.proxied_dashboard_path) {
    return URLExt.join(PageConfig.getBaseUrl(), e.proxied_dashboard_path);
  }
  return e.dashboard_url || null;
}

function el<K extends keyof HTMLElementTagNameMap>(tag: K, className: string, text?: string) {
  const node = document.createElement(tag);
  node.className = className;
  if (text !== undefined) {
    node.textContent = text;
  }
  return node;
}

function button(className: string, label: string, title: string, onClick: () => void): HTMLButtonElement {
  const b = el('button', `jp-Button jp-mod-minimal gnb-btn ${className}`, label);
  b.type = 'button';
  b.title = title;
  b.addEventListener('click', event => {
    event.stopPropagation();
    onClick();
  });
  return b;
}

/** One row; built once per entry (its shape depends on whether it is an orphan) and updated in place. */
class Row {
  readonly node: HTMLDivElement;
  readonly orphan: boolean;
  private _fields = new Map<string, HTMLElement>();
  private _bar: HTMLDivElement | null = null;
  private _ray: HTMLAnchorElement | null = null;
  private _owner: HTMLButtonElement | null = null;
  private _use: HTMLButtonElement | null = null;
  private _entry: IEntry;

  constructor(
    entry: IEntry,
    private _panel: ClusterSidebar
  ) {
    this._entry = entry;
    this.orphan = !!entry.orphan;
    this.node = el('div', 'gnb-cluster-row');
    this.node.dataset.id = entry.id;
    const head = el('div', 'gnb-row-head');
    head.append(this._field('name', 'gnb-name'), this._field('kind', 'gnb-kind'), this._field('state', 'gnb-state'));
    this.node.append(head);
    const owner = el('div', 'gnb-row-owner');
    owner.append(el('span', 'gnb-key', 'notebook '), this._field('notebook', 'gnb-notebook'));
    this.node.append(owner);
    const stats = el('div', 'gnb-row-stats');
    for (const [field, label] of [
      ['nodes', 'nodes'],
      ['gpus', 'GPUs'],
      ['util_gpu', 'util'],
      ['usd_per_hour', '$/h'],
      ['spent_usd', 'spent'],
      ['idle_stop_in_s', 'idle stop']
    ]) {
      const cell = el('span', 'gnb-stat');
      cell.append(el('span', 'gnb-key', label), this._field(field, 'gnb-val'));
      stats.append(cell);
    }
    this.node.append(stats);
    const budget = el('div', 'gnb-budget');
    budget.dataset.field = 'budget';
    this._bar = el('div', 'gnb-budget-bar');
    const track = el('div', 'gnb-budget-track');
    track.append(this._bar);
    budget.append(track, this._field('budget_text', 'gnb-budget-text'));
    this.node.append(budget);
    const buttons = el('div', 'gnb-row-buttons');
    if (this.orphan) {
      const reaper = el('div', 'gnb-reaper');
      reaper.append(el('span', 'gnb-key', 'reaper '), this._field('reaper', 'gnb-reaper-state'));
      const log = this._field('reaper_log', 'gnb-reaper-log');
      this.node.append(reaper, log);
      buttons.append(
        button('gnb-teardown', 'Tear down now', 'Run the reaper’s teardown of this orphan now', () =>
          this._panel.teardown(this._entry)
        )
      );
    } else {
      buttons.append(
        button('gnb-dashboard-btn', 'Dashboard', 'Open this cluster’s dashboard pane', () =>
          this._panel.actions.openDashboard(this._entry)
        )
      );
      this._ray = el('a', 'jp-Button jp-mod-minimal gnb-btn gnb-ray-dashboard', 'Ray');
      this._ray.target = '_blank';
      this._ray.rel = 'noopener noreferrer';
      this._ray.title = 'Open the Ray dashboard in a new tab';
      buttons.append(this._ray);
      buttons.append(
        button('gnb-stop', 'Stop', 'Stop this cluster (asks first)', () => this._panel.stop(this._entry)),
        button('gnb-scale', 'Scale', 'Change the number of workers', () => this._panel.scale(this._entry))
      );
      this._owner = button('gnb-open-notebook', 'Notebook', 'Open the notebook that owns this cluster', () => {
        if (this._entry.notebook) {
          this._panel.actions.openNotebook(this._entry.notebook);
        }
      });
      this._use = button('gnb-use', 'Use here', 'Insert a cell that attaches the current notebook to it', () =>
        this._panel.use(this._entry)
      );
      buttons.append(this._owner, this._use);
    }
    this.node.append(buttons);
    this.update(entry);
  }

  private _field(name: string, className: string): HTMLElement {
    const span = el('span', className);
    span.dataset.field = name;
    this._fields.set(name, span);
    return span;
  }

  private _set(name: string, text: string, raw?: number | null): void {
    const node = this._fields.get(name);
    if (!node) {
      return;
    }
    if (node.textContent !== text) {
      node.textContent = text;
    }
    if (typeof raw === 'number') {
      node.dataset.value = String(raw);
    } else {
      delete node.dataset.value;
    }
  }

  update(e: IEntry): void {
    this._entry = e;
    this.node.dataset.state = e.state ?? '';
    this.node.dataset.kernel = e.kernel_id ?? '';
    this.node.classList.toggle('gnb-orphan', !!e.orphan);
    this.node.classList.toggle('gnb-busy', !!e.busy);
    this._set('name', e.name);
    this._set('kind', e.kind + (e.cloud ? `/${e.cloud}` : ''));
    this._set('state', e.state ?? '-');
    this._set('notebook', e.notebook || '(unknown)');
    this._set('nodes', e.nodes === null || e.nodes === undefined ? '-' : String(e.nodes), e.nodes);
    this._set('gpus', e.gpus === null || e.gpus === undefined ? '-' : String(e.gpus), e.gpus);
    this._set('util_gpu', typeof e.util_gpu === 'number' ? `${Math.round(e.util_gpu)}%` : '-', e.util_gpu);
    this._set('usd_per_hour', money(e.usd_per_hour), e.usd_per_hour);
    this._set('spent_usd', money(e.spent_usd), e.spent_usd);
    this._set('idle_stop_in_s', e.idle_stop_min ? countdown(e.idle_stop_in_s) : 'off', e.idle_stop_in_s);
    const budget = e.budget_usd;
    const spent = e.spent_usd ?? 0;
    if (typeof budget === 'number' && budget > 0) {
      const f = Math.min(1, Math.max(0, spent / budget));
      this._bar!.style.width = `${(100 * f).toFixed(1)}%`;
      this._bar!.classList.toggle('gnb-warn', f >= 0.9);
      this._set('budget_text', `${money(spent)} of ${money(budget)}`, f);
    } else {
      this._bar!.style.width = '0';
      this._set('budget_text', 'no budget');
    }
    if (this.orphan) {
      this._set('reaper', e.reaper?.state ?? 'unknown');
      const log = e.reaper?.log;
      this._set('reaper_log', Array.isArray(log) ? log.join('\n') : log || '');
    }
    if (this._ray) {
      const href = rayDashboardHref(e);
      this._ray.hidden = !href;
      if (href && this._ray.getAttribute('href') !== href) {
        this._ray.href = href;
      }
    }
    if (this._owner) {
      this._owner.disabled = !e.notebook;
    }
    if (this._use) {
      this._use.disabled = !e.attach_code;
    }
  }
}

export class ClusterSidebar extends Widget {
  private _rows = new Map<string, Row>();
  private _list: HTMLDivElement;
  private _empty: HTMLDivElement;
  private _error: HTMLDivElement;
  private _message: HTMLDivElement;

  constructor(
    private _model: ClusterModel,
    readonly actions: ISidebarActions
  ) {
    super();
    this.id = 'gpu-notebook:sidebar';
    this.addClass('gnb-sidebar');
    this.title.icon = gpuIcon;
    this.title.caption = 'GPU clusters';
    const header = el('div', 'gnb-sidebar-header');
    header.append(el('h2', 'gnb-sidebar-title', 'GPU clusters'));
    this._error = el('div', 'gnb-error');
    this._message = el('div', 'gnb-message');
    this._empty = el('div', 'gnb-empty', 'Asking the server...');
    this._list = el('div', 'gnb-cluster-list');
    this.node.append(header, this._error, this._message, this._empty, this._list);
    this._model.changed.connect(this._render, this);
    this._render();
  }

  dispose(): void {
    this._model.changed.disconnect(this._render, this);
    super.dispose();
  }

  private _render(): void {
    const entries = this._model.entries;
    this._error.textContent = this._model.error ? `No update: ${this._model.error}` : '';
    this._error.hidden = !this._model.error;
    if (!this._model.loaded) {
      this._empty.textContent = this._model.error ? 'The gpu_notebook server extension did not answer.' : 'Asking the server...';
    } else {
      this._empty.textContent = 'No cluster. Start one in a notebook: %load_ext gpu_notebook, then %gpu_cluster start';
    }
    this._empty.hidden = this._model.loaded && entries.length > 0;
    const seen = new Set<string>();
    entries.forEach((entry, i) => {
      seen.add(entry.id);
      let row = this._rows.get(entry.id);
      if (row && row.orphan !== !!entry.orphan) {
        row.node.remove(); // a cluster whose kernel died became an orphan: its row changes shape
        row = undefined;
      }
      if (!row) {
        row = new Row(entry, this);
        this._rows.set(entry.id, row);
      } else {
        row.update(entry);
      }
      if (this._list.children[i] !== row.node) {
        this._list.insertBefore(row.node, this._list.children[i] ?? null);
      }
    });
    for (const [id, row] of this._rows) {
      if (!seen.has(id)) {
        row.node.remove();
        this._rows.delete(id);
      }
    }
  }

  /** Say what an action answered, in the sidebar and as a notification. */
  report(what: string, reply: IReply): void {
    this._message.textContent = `${what}: ${reply.message}`;
    this._message.classList.toggle('gnb-failed', !reply.ok);
    this._message.dataset.ok = String(reply.ok);
    if (reply.ok) {
      Notification.success(`${what}: ${reply.message}`, { autoClose: 5000 });
    } else {
      Notification.error(`${what}: ${reply.message}`, { autoClose: 10000 });
    }
  }

  async stop(e: IEntry): Promise<void> {
    const result = await showDialog({
      title: `Stop cluster ${e.name}?`,
      body:
        `Its workers end${e.busy ? ', and the cell running on it ends with "Cluster stopped: from the JupyterLab panel"' : ''}.` +
        (e.notebook ? ` It belongs to ${e.notebook}.` : ''),
      buttons: [Dialog.cancelButton(), Dialog.warnButton({ label: 'Stop' })]
    });
    if (!result.button.accept) {
      return;
    }
    this.report(`Stop ${e.name}`, await act(e.id, 'stop'));
    await this._model.refresh();
  }

  async scale(e: IEntry): Promise<void> {
    const result = await InputDialog.getNumber({
      title: `Scale cluster ${e.name}: number of workers`,
      value: typeof e.workers === 'number' ? e.workers : 1
    });
    if (!result.button.accept || result.value === null) {
      return;
    }
    const workers = Math.round(result.value);
    if (!(workers >= 0)) {
      this.report(`Scale ${e.name}`, { ok: false, message: 'give a whole number of workers' });
      return;
    }
    this.report(`Scale ${e.name} to ${workers}`, await act(e.id, 'scale', { workers }));
    await this._model.refresh();
  }

  async teardown(e: IEntry): Promise<void> {
    const result = await showDialog({
      title: `Tear down ${e.name} now?`,
      body: `Its kernel is gone. This deletes the cloud machines of ${e.name} now, as the reaper would.`,
      buttons: [Dialog.cancelButton(), Dialog.warnButton({ label: 'Tear down' })]
    });
    if (!result.button.accept) {
      return;
    }
    this.report(`Tear down ${e.name}`, await act(e.id, 'teardown'));
    await this._model.refresh();
  }

  use(e: IEntry): void {
    if (!e.attach_code) {
      return;
    }
    if (!this.actions.useInCurrentNotebook(e.attach_code)) {
      this.report(`Use ${e.name}`, { ok: false, message: 'open a notebook first: the cell goes into the current one' });
    }
  }
}
