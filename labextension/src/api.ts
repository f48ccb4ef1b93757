/**
 * The REST contract of the server extension (docs/dev/panel-protocol.md): the shapes it answers and the one
 * function every request goes through, `ServerConnection.makeRequest`, so the server's base URL, token and XSRF
 * cookie work behind JupyterHub and Binder as they do on a laptop.
 */
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

/** The reaper's view of an orphan (a cloud cluster whose kernel is gone). */
export interface IReaper {
  state: 'tearing down' | 'gone' | 'up and costing' | string;
  log?: string | string[] | null;
}

/** One cluster: the kernel's card and live part flattened, plus what the server adds. */
export interface IEntry {
  /** `<kernel_id>/<quoted name>`: stable for the cluster's life; rows and panes are keyed by it. */
  id: string;
  name: string;
  kind: string;
  cloud?: string | null;
  state: string;
  kernel_id: string;
  kernel_alive?: boolean;
  pid?: number;
  notebook?: string | null;
  workers?: number | null;
  started_at?: number | null;
  busy?: boolean;
  dashboard_url?: string | null;
  proxied_dashboard_path?: string | null;
  budget_usd?: number | null;
  idle_stop_min?: number | null;
  attach_code?: string | null;
  // the live part (absent until the kernel first publishes it)
  t?: number;
  nodes?: number | null;
  gpus?: number | null;
  util_gpu?: number | null;
  mem_used_mib?: number | null;
  usd_per_hour?: number | null;
  spent_usd?: number | null;
  idle_stop_in_s?: number | null;
  budget_left_usd?: number | null;
  monitoring?: boolean;
  orphan?: boolean;
  reaper?: IReaper | null;
}

export interface IClusters {
  now: number;
  clusters: IEntry[];
}

/** Values may be null where a sample was missing (NaN in the kernel). */
export type Values = Array<number | null>;

export interface IGpuSeries {
  node: string;
  index: number;
  label: string;
  util_gpu: Values;
  mem_used_mib: Values;
  mem_total_mib?: number | null;
  power_w: Values;
}

export interface IHostSeries {
  node: string;
  label: string;
  cpu_percent: Values;
  mem_used_mib: Values;
  net_rx_Bps: Values;
  net_tx_Bps: Values;
}

export interface ISeries {
  t: number[];
  gpus: IGpuSeries[];
  hosts: IHostSeries[];
  cost: { t: number[]; spent_usd: Values; usd_per_hour: Values };
}

/** What an action answers. */
export interface IReply {
  ok: boolean;
  message: string;
}

/** An HTTP answer that was not 2xx; `status` 404 means the cluster is gone. */
export class RequestError extends Error {
  constructor(
    readonly status: number,
    message: string
  ) {
    super(message);
  }
}

const API = 'gpu-notebook/api';

/** `path` under the server's API root, each part of a cluster id kept as quoted as the server sent it. */
function url(settings: ServerConnection.ISettings, ...parts: string[]): string {
  return URLExt.join(settings.baseUrl, API, ...parts);
}

async function request<T>(path: string[], init: RequestInit = {}): Promise<T> {
  const settings = ServerConnection.makeSettings();
  let response: Response;
  try {
    response = await ServerConnection.makeRequest(url(settings, ...path), init, settings);
  } catch (error) {
    throw new RequestError(0, `the Jupyter server cannot be reached (${String(error)})`);
  }
  const text = await response.text();
  let data: any = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch {
    data = null;
  }
  if (!response.ok) {
    const message = (data && (data.message || data.reason)) || response.statusText || 'request failed';
    throw new RequestError(response.status, `${response.status}: ${message}`);
  }
  return data as T;
}

/** Every cluster of every kernel of this server (the server marks the feed as watched on each call). */
export function fetchClusters(): Promise<IClusters> {
  return request<IClusters>(['clusters']);
}

/** One cluster's recent series; a `RequestError` with status 404 when it is gone. */
export function fetchSeries(id: string): Promise<ISeries> {
  return request<ISeries>(['clusters', id, 'series']);
}

/** Run an action (`stop`, `scale`, `teardown`) on a cluster; the kernel's (or the reaper's) reply. */
export async function act(id: string, action: 'stop' | 'scale' | 'teardown', body?: object): Promise<IReply> {
  try {
    return await request<IReply>(['clusters', id, action], {
      method: 'POST',
      body: JSON.stringify(body ?? {})
    });
  } catch (error) {
    return { ok: false, message: error instanceof Error ? error.message : String(error) };
  }
}
