/**
 * gpu_notebook's JupyterLab 4 / Notebook 7 extension: the "GPU clusters" sidebar, a dashboard pane per cluster
 * and the status item, all fed by one poll of the server extension's REST API (gpu_notebook/labpanel, see
 * docs/dev/panel-protocol.md).
 *
 * JupyterLab and Notebook 7 differ in three places, each decided by whether the application has a Lab shell or a
 * status bar: the status item goes in the status bar, else in the top area (Notebook 7 has no status bar); a
 * dashboard goes in the main area, else in the bottom panel (Notebook 7's main area holds the one notebook);
 * dashboards are restored with the layout where a layout restorer exists.
 */
import {
  ILabShell,
  ILayoutRestorer,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { ICommandPalette, MainAreaWidget, WidgetTracker } from '@jupyterlab/apputils';
import { INotebookTracker, NotebookActions } from '@jupyterlab/notebook';
import { IStatusBar } from '@jupyterlab/statusbar';
import { SplitPanel, TabPanel, Widget } from '@lumino/widgets';

import { IEntry } from './api';
import { DashboardPane } from './dashboard';
import { gpuIcon } from './icons';
import { ClusterModel } from './model';
import { ClusterSidebar } from './sidebar';
import { StatusItem } from './status';

namespace CommandIDs {
  export const openDashboard = 'gpu-notebook:open-dashboard';
  export const openSidebar = 'gpu-notebook:open-sidebar';
}

const SIDEBAR_ID = 'gpu-notebook:sidebar';

/** Notebook 7's bottom panel: select the widget's tab, and give the panel room (it opens with no height, as its
 * split was sized while it was hidden). */
function showInBottomPanel(widget: Widget): void {
  const tabs = widget.parent?.parent;
  if (tabs instanceof TabPanel) {
    tabs.currentWidget = widget;
  }
  const split = tabs?.parent;
  if (split instanceof SplitPanel && split.widgets.length === 2) {
    const sizes = split.relativeSizes();
    if (sizes[1] < 0.2) {
      split.setRelativeSizes([0.45, 0.55]);
    }
  }
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'gpu-notebook:plugin',
  description: 'GPU clusters sidebar, dashboards and status item for gpu_notebook.',
  autoStart: true,
  optional: [ILabShell, ILayoutRestorer, IStatusBar, INotebookTracker, ICommandPalette],
  activate: (
    app: JupyterFrontEnd,
    labShell: ILabShell | null,
    restorer: ILayoutRestorer | null,
    statusBar: IStatusBar | null,
    notebooks: INotebookTracker | null,
    palette: ICommandPalette | null
  ) => {
    const model = new ClusterModel();
    const tracker = new WidgetTracker<MainAreaWidget<DashboardPane>>({ namespace: 'gpu-notebook-dashboard' });
    const dashboardArea = labShell ? 'main' : 'down';

    app.commands.addCommand(CommandIDs.openDashboard, {
      label: args => (args.name ? `GPU dashboard: ${args.name}` : 'GPU cluster dashboard'),
      caption: 'Open a gpu_notebook cluster’s dashboard',
      icon: gpuIcon,
      execute: args => {
        const id = String(args.id ?? '');
        const name = String(args.name ?? id);
        if (!id) {
          return;
        }
        const reveal = (widget: Widget) => {
          app.shell.activateById(widget.id);
          if (!labShell) {
            showInBottomPanel(widget);
          }
        };
        const open = tracker.find(w => w.content.clusterId === id);
        if (open) {
          reveal(open);
          return open;
        }
        const content = new DashboardPane(model, id, name);
        const widget = new MainAreaWidget({ content });
        widget.id = content.id;
        widget.title.label = content.title.label;
        widget.title.icon = gpuIcon;
        widget.title.closable = true;
        content.title.changed.connect(() => (widget.title.label = content.title.label));
        widget.addClass('gnb-dashboard-panel');
        void tracker.add(widget);
        // the first dashboard beside the notebook, later ones as tabs next to it
        const sibling = tracker.find(w => w !== widget && w.isAttached);
        app.shell.add(widget, dashboardArea, {
          mode: sibling ? 'tab-after' : 'split-right',
          ref: sibling?.id ?? null
        } as any);
        reveal(widget);
        return widget;
      }
    });

    if (restorer) {
      void restorer.restore(tracker, {
        command: CommandIDs.openDashboard,
        args: w => ({ id: w.content.clusterId, name: w.content.clusterName }),
        name: w => w.content.clusterId
      });
    }

    const currentNotebook = () => {
      const current = notebooks?.currentWidget ?? null;
      // in JupyterLab the tracker's current notebook stays current while the sidebar has the focus
      return current && !current.isDisposed ? current : null;
    };

    const sidebar = new ClusterSidebar(model, {
      openDashboard: (e: IEntry) => void app.commands.execute(CommandIDs.openDashboard, { id: e.id, name: e.name }),
      openNotebook: (path: string) => void app.commands.execute('docmanager:open', { path }),
      hasCurrentNotebook: () => currentNotebook() !== null,
      useInCurrentNotebook: (code: string) => {
        const panel = currentNotebook();
        if (!panel) {
          return false;
        }
        const notebook = panel.content;
        NotebookActions.insertBelow(notebook);
        notebook.activeCell?.model.sharedModel.setSource(code);
        app.shell.activateById(panel.id);
        return true;
      }
    });
    app.shell.add(sidebar, 'left', { rank: 450 });
    if (restorer) {
      restorer.add(sidebar, SIDEBAR_ID);
    }

    app.commands.addCommand(CommandIDs.openSidebar, {
      label: 'GPU clusters',
      caption: 'Show the gpu_notebook GPU clusters sidebar',
      icon: gpuIcon,
      execute: () => app.shell.activateById(SIDEBAR_ID)
    });
    if (palette) {
      palette.addItem({ command: CommandIDs.openSidebar, category: 'GPU' });
    }

    if (notebooks) {
      const item = new StatusItem(model, notebooks, () => void app.commands.execute(CommandIDs.openSidebar));
      if (statusBar) {
        statusBar.registerStatusItem('gpu-notebook:status', {
          item,
          align: 'left',
          rank: 10,
          isActive: () => item.active,
          activeStateChanged: model.changed
        });
      } else {
        // Notebook 7 has no status bar: the top area, as jupyter-resource-usage does
        app.shell.add(item, 'top', { rank: 1000 });
      }
    }
    model.start();
  }
};

export default plugin;
