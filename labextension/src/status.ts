/**
 * The status item: "2 GPUs · 87% · $3.20/h" for the current notebook's cluster (the entry whose `kernel_id` is
 * the notebook's kernel's), red (`gnb-alert`) when the GPUs are under 70% busy or 90% of the budget is spent.
 * JupyterLab puts it in the status bar; Notebook 7, which has none, in its top area. A click opens the sidebar.
 */
import { INotebookTracker } from '@jupyterlab/notebook';
import { Widget } from '@lumino/widgets';

import { IEntry } from './api';
import { ClusterModel } from './model';

export const LOW_UTIL = 70;
export const BUDGET_WARN = 0.9;

/** Why an entry deserves red, or null. */
export function alertReason(e: IEntry): string | null {
  if (typeof e.budget_usd === 'number' && e.budget_usd > 0 && (e.spent_usd ?? 0) >= BUDGET_WARN * e.budget_usd) {
    return `spent ${(100 * (e.spent_usd ?? 0) / e.budget_usd).toFixed(0)}% of the budget`;
  }
  if ((e.gpus ?? 0) > 0 && typeof e.util_gpu === 'number' && e.util_gpu < LOW_UTIL) {
    return `GPUs under ${LOW_UTIL}% busy`;
  }
  return null;
}

export function statusText(e: IEntry): string {
  const gpus = e.gpus ?? 0;
  const parts = [`${gpus} GPU${gpus === 1 ? '' : 's'}`];
  if (typeof e.util_gpu === 'number') {
    parts.push(`${Math.round(e.util_gpu)}%`);
  }
  if (typeof e.usd_per_hour === 'number') {
    parts.push(`$${e.usd_per_hour.toFixed(2)}/h`);
  }
  return parts.join(' · ');
}

export class StatusItem extends Widget {
  constructor(
    private _model: ClusterModel,
    private _tracker: INotebookTracker,
    private _open: () => void
  ) {
    super();
    this.addClass('gnb-status');
    this.id = 'gpu-notebook:status';
    this.node.title = 'gpu_notebook: the current notebook’s cluster (click for the GPU clusters sidebar)';
    this.node.addEventListener('click', () => this._open());
    this._model.changed.connect(this._render, this);
    this._tracker.currentChanged.connect(this._render, this);
    this._render();
  }

  dispose(): void {
    this._model.changed.disconnect(this._render, this);
    this._tracker.currentChanged.disconnect(this._render, this);
    super.dispose();
  }

  /** Whether the current notebook has a cluster to show. */
  get active(): boolean {
    return !this.node.hidden;
  }

  /** The current notebook's kernel id, if it has one. */
  private _kernelId(): string | null {
    return this._tracker.currentWidget?.sessionContext.session?.kernel?.id ?? null;
  }

  private _render(): void {
    const entries = this._model.forKernel(this._kernelId());
    const e = entries[0];
    this.node.classList.toggle('gnb-hidden', !e);
    this.node.hidden = !e; // nothing to show for a notebook without a cluster
    if (!e) {
      this.node.textContent = '';
      delete this.node.dataset.id;
      this.removeClass('gnb-alert');
      return;
    }
    const more = entries.length > 1 ? ` (+${entries.length - 1})` : '';
    this.node.textContent = statusText(e) + more;
    this.node.dataset.id = e.id;
    const reason = alertReason(e);
    this.node.classList.toggle('gnb-alert', reason !== null);
    this.node.title = `gpu_notebook: cluster ${e.name}${reason ? ` (${reason})` : ''}; click for the GPU clusters sidebar`;
  }
}
