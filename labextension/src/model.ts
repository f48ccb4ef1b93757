/**
 * One poll of `GET clusters` for the whole page: the sidebar and the status item read the same answer, so the
 * server (and through its "watching" mark, the kernels' publishers) sees one reader per browser tab, not one per
 * view. It asks once a second while the page is visible and every 10 s while it is hidden, and a failed request
 * keeps the last answer and says why.
 */
import { ISignal, Signal } from '@lumino/signaling';

import { IClusters, IEntry, fetchClusters } from './api';

export const POLL_MS = 1000;
const HIDDEN_POLL_MS = 10000;

export class ClusterModel {
  private _entries: IEntry[] = [];
  private _error: string | null = null;
  private _loaded = false;
  private _now = 0;
  private _timer: number | null = null;
  private _disposed = false;
  private _changed = new Signal<this, void>(this);

  /** Start polling (the first request goes out at once). */
  start(): void {
    if (this._timer === null && !this._disposed) {
      void this._tick();
    }
  }

  dispose(): void {
    this._disposed = true;
    if (this._timer !== null) {
      window.clearTimeout(this._timer);
      this._timer = null;
    }
    Signal.clearData(this);
  }

  /** Emitted after every poll, whether it brought news or an error. */
  get changed(): ISignal<this, void> {
    return this._changed;
  }

  get entries(): IEntry[] {
    return this._entries;
  }

  /** Whether a first answer has come (before it, an empty list means "not known yet"). */
  get loaded(): boolean {
    return this._loaded;
  }

  /** The last poll's failure, or null. */
  get error(): string | null {
    return this._error;
  }

  /** The server's clock at the last answer (seconds). */
  get now(): number {
    return this._now;
  }

  find(id: string): IEntry | undefined {
    return this._entries.find(e => e.id === id);
  }

  /** The cluster(s) of the kernel `kernelId`, orphans excluded. */
  forKernel(kernelId: string | null | undefined): IEntry[] {
    if (!kernelId) {
      return [];
    }
    return this._entries.filter(e => e.kernel_id === kernelId && !e.orphan);
  }

  /** Poll now (after an action) instead of waiting for the next tick. */
  refresh(): Promise<void> {
    return this._poll();
  }

  private async _tick(): Promise<void> {
    await this._poll();
    if (this._disposed) {
      return;
    }
    const delay = document.visibilityState === 'hidden' ? HIDDEN_POLL_MS : POLL_MS;
    this._timer = window.setTimeout(() => void this._tick(), delay);
  }

  private async _poll(): Promise<void> {
    try {
      const answer: IClusters = await fetchClusters();
      this._entries = Array.isArray(answer?.clusters) ? answer.clusters : [];
      this._now = typeof answer?.now === 'number' ? answer.now : Date.now() / 1000;
      this._error = null;
      this._loaded = true;
    } catch (error) {
      this._error = error instanceof Error ? error.message : String(error);
    }
    if (!this._disposed) {
      this._changed.emit();
    }
  }
}
